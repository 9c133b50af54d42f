"""bench/protocol_goals.py: a goal passes on its median, and never on rounds the verifier's load
rule shortened (cheaper rounds than the ones the goals are set for)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

_PATH = Path(__file__).resolve().parents[2] / "bench" / "protocol_goals.py"
_SPEC = importlib.util.spec_from_file_location("protocol_goals", _PATH)
assert _SPEC is not None and _SPEC.loader is not None
goals = importlib.util.module_from_spec(_SPEC)
sys.modules.setdefault("protocol_goals", goals)  # its dataclasses look their module up
_SPEC.loader.exec_module(goals)


def _level(repeat: int, rps: float, tokens: float) -> dict[str, Any]:
    return {"server": "native", "repeat": repeat, "rule": 1, "concurrency": 256, "rps": rps, "load": 1.0,
            "tokens_per_round": tokens, "p99_ms": 50.0,
            "cpu_us_per_round": {"verifier": 100.0, "mlc": 20.0, "router": 0.0, "drafters": 0.0}}


def _rps_goal(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out = goals.evaluate(rows, [], "native", "native")
    return next(r for r in out if r["goal"] == "rule-1 rounds/s at 256 sessions")


def test_full_rounds_pass_on_the_median() -> None:
    row = _rps_goal([_level(0, 4900, 4.9), _level(1, 5100, 4.95), _level(2, 5200, 4.9)])
    assert row["pass"] and row["median"] == 5100 and row["tokens_per_round"] == [4.9, 4.95]
    assert "shortened" not in goals.report([row])


def test_rounds_shortened_by_the_load_rule_pass_nothing() -> None:
    row = _rps_goal([_level(0, 6600, 3.1), _level(1, 6500, 4.9), _level(2, 6700, 4.9)])
    assert not row["pass"]  # 6,600 rounds/s, but one repeat's rounds committed 3.1 tokens, not 5
    assert "rounds shortened to 3.10 tokens" in goals.report([row])
