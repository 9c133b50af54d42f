"""The session builders of tests/protocol/sessionkit.py, for the §6 conformance tests.

Imported from its own package rather than copied.
"""

from __future__ import annotations

from tests.protocol import sessionkit as kit

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
