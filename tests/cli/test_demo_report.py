"""The demo's speedup figures: pairs interleaved with the order swapped, the median with its
range, the flag when the range is as wide as the effect, and the why (time per pass, bound)."""

from __future__ import annotations

import argparse

import pytest

from sdcp_fast.cli._demo_report import Timed, comparison, interleaved, report


def test_pairs_alternate_which_side_runs_first() -> None:
    order: list[str] = []

    def side(name: str, seconds: float, passes: int):
        def run(i: int) -> Timed:
            order.append(f"{name}{i}")
            return Timed(tokens=40, seconds=seconds, passes=passes)
        return run

    pairs = interleaved(side("s", 1.0, 10), side("b", 2.0, 40), 4)
    assert order == ["s0", "b0", "b1", "s1", "s2", "b2", "b3", "s3"]
    assert all(s.passes == 10 and b.passes == 40 for s, b in pairs)


def test_comparison_gives_the_median_range_and_why() -> None:
    pairs = [(Timed(40, 1.0, 10, proposed=40, accepted=30, rounds=10), Timed(40, 2.0, 40)),
             (Timed(40, 1.0, 10, proposed=40, accepted=30, rounds=10), Timed(40, 3.0, 40)),
             (Timed(40, 1.0, 10, proposed=40, accepted=30, rounds=10), Timed(40, 2.5, 40))]
    got = comparison(pairs, [True])
    assert (got["speedup"], got["speedup_min"], got["speedup_max"]) == (2.5, 2.0, 3.0)
    assert not got["spread_as_large_as_effect"]
    assert got["ms_per_pass"] == {"speculative": 100.0, "target_only": 62.5}
    assert got["bound"] == 4.0 and got["pass_cost"] == 1.6
    assert got["acceptance"] == 0.75 and got["mean_m"] == 4.0
    assert [p["first"] for p in got["pairs"]] == ["speculative", "target-only", "speculative"]


def test_a_range_as_wide_as_the_effect_is_said(capsys: pytest.CaptureFixture[str]) -> None:
    pairs = [(Timed(40, 1.0, 10), Timed(40, 0.9, 40)), (Timed(40, 1.0, 10), Timed(40, 1.4, 40))]
    got = comparison(pairs, None)
    assert got["spread_as_large_as_effect"]
    out = {"sessions": [], "tokens": 40, "baseline": got}
    assert report(out, argparse.Namespace(json=False), [], "summary") == 0
    text = capsys.readouterr().out
    assert "speedup 1.15x (median of 2; range 0.9-1.4x)" in text
    assert "is as large as the effect" in text and "cannot tell speculation from noise" in text
    assert "ms speculative" in text and "bound the speedup at 4.0x" in text


def test_a_wide_range_that_never_crosses_one_keeps_the_sign(capsys: pytest.CaptureFixture[str]) -> None:
    pairs = [(Timed(40, 1.0, 10), Timed(40, 1.56, 40)), (Timed(40, 1.0, 10), Timed(40, 2.16, 40)),
             (Timed(40, 1.0, 10), Timed(40, 1.58, 40))]
    got = comparison(pairs, None)
    assert got["spread_as_large_as_effect"]
    report({"sessions": [], "tokens": 40, "baseline": got}, argparse.Namespace(json=False), [], "summary")
    text = capsys.readouterr().out
    assert "its sign is not (every pair agrees)" in text and "noise" not in text
