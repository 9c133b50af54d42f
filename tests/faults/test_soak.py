"""bench/soak.py's short run in CI: concurrent sessions under periodic faults lose and
duplicate nothing, every log keeps its invariants, no MLC lease stays held once the sessions
ended, and each role process's open file descriptors stay bounded."""

from __future__ import annotations

import asyncio
import importlib.util
import sys
from pathlib import Path

import pytest

from .faultkit import FaultUp, metric

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
    """Each fault is injected once at least, however long a loaded machine takes over each
    (``min_faults``: the soak goes on until then), and the verifier stop fails sessions over
    (it lasts until the router fenced one)."""
    soak = load_soak()
    kinds = ("kill-verifier", "cut-connections", "stop-verifier")
    before = metric(whole, "router", "sdcp_failovers_total")
    report = asyncio.run(soak.soak(whole, duration=24, sessions=4, fault_every=6, max_tokens=60, seed=seed,
                                   faults=kinds, stuck_after=60, min_faults=len(kinds)))
    failovers = metric(whole, "router", "sdcp_failovers_total") - before
    summary = report.summary()
    assert summary["sessions_completed"] > 0, summary
    assert summary["tokens_lost"] == 0 and summary["duplicates"] == 0, summary
    assert not summary["log_violations"] and summary["stuck"] == 0, summary
    assert summary["leases_at_end"] == 0, summary
    assert all(summary["faults"][kind] >= 1 for kind in kinds), summary
    assert failovers >= 1, (failovers, summary)
    for name, bounds in summary["processes"].items():
        assert bounds["fds_max"] < 256, (name, bounds)
