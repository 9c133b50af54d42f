"""The session builders of tests/protocol/sessionkit.py, for the §6 conformance tests.

The test directories are not packages, so the kit is imported from its own directory
rather than copied.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

_PROTOCOL_TESTS = str(Path(__file__).resolve().parents[1] / "protocol")
if _PROTOCOL_TESTS not in sys.path:
    sys.path.append(_PROTOCOL_TESTS)
kit = importlib.import_module("sessionkit")

DRAFTER = kit.DRAFTER
PROMPT = kit.PROMPT
SID = kit.SID
STATUS = kit.STATUS
TARGET = kit.TARGET
VERIFIER = kit.VERIFIER
assignment = kit.assignment
contract = kit.contract
open_session = kit.open_session
proposal = kit.proposal
q_bytes = kit.q_bytes
run_round = kit.run_round
