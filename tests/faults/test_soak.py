"""bench/soak.py's short run in CI: concurrent sessions under periodic faults lose and
duplicate nothing, every log keeps its invariants, no MLC lease stays held once the sessions
ended, and each role process's open file descriptors stay bounded."""

from __future__ import annotations

import asyncio
import importlib.util
import sys
from pathlib import Path

import pytest

from .faultkit import FaultUp

pytestmark = pytest.mark.services

SOAK = Path(__file__).resolve().parents[2] / "bench" / "soak.py"


def load_soak():
    spec = importlib.util.spec_from_file_location("soak", SOAK)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["soak"] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_a_short_soak_loses_and_duplicates_nothing(whole: FaultUp, seed: int) -> None:
    soak = load_soak()
    report = asyncio.run(soak.soak(whole, duration=24, sessions=4, fault_every=6, max_tokens=60, seed=seed,
                                   faults=("kill-verifier", "cut-connections", "stop-verifier"), stuck_after=60))
    summary = report.summary()
    assert summary["sessions_completed"] > 0, summary
    assert summary["tokens_lost"] == 0 and summary["duplicates"] == 0, summary
    assert not summary["log_violations"] and summary["stuck"] == 0, summary
    assert summary["leases_at_end"] == 0, summary
    assert sum(summary["faults"].values()) >= 2, summary
    for name, bounds in summary["processes"].items():
        assert bounds["fds_max"] < 256, (name, bounds)
