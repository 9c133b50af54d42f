"""The demo's speedup figures: pairs interleaved with the order swapped, the median with its
range, the flag when the range is as wide as the effect, and the why (per session pass: tokens, time,
the bound from them, and what it would take when speculation cannot pay)."""

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
    assert "cannot pay" not in text


def test_the_bound_counts_session_passes_not_shared_passes() -> None:
    # Three sessions, 30 tokens each. Target-only scores all three in every pass: 30 passes,
    # 90 session passes, 3 tokens per pass. Speculative commits 3 tokens per session pass,
    # but its rounds rarely line up: 30 session passes in 25 passes. Counted over whole passes
    # the bound would be 30 / 25 = 1.2x; per session pass it is 90 / 30 = 3x.
    spec = Timed(90, 1.5, 25, proposed=120, accepted=60, rounds=30, session_passes=30, draft_seconds=0.3)
    base = Timed(90, 3.0, 30, session_passes=90)
    got = comparison([(spec, base)], [True, True, True])
    assert got["tokens_per_session_pass"] == {"speculative": 3.0, "target_only": 1.0}
    assert got["tokens_per_pass"] == {"speculative": 3.6, "target_only": 3.0}
    assert got["bound"] == 3.0
    assert got["ms_per_session_pass"] == {"speculative": 50.0, "target_only": 33.333}
    assert got["ms_drafting_per_session_pass"] == 10.0
    assert got["pass_cost"] == 1.5 and got["bound_from_costs"] == 2.0 == got["speedup"]


def test_a_drafter_that_cannot_pay_is_told_what_it_would_take(capsys: pytest.CaptureFixture[str]) -> None:
    # 1.25 tokens per session pass, each costing 2x a target-only one: 0.62x at best.
    spec = Timed(40, 3.2, 32, proposed=64, accepted=8, rounds=32, session_passes=32, draft_seconds=1.0)
    base = Timed(40, 2.0, 40, session_passes=40)
    got = comparison([(spec, base)], [True])
    assert got["bound"] == 1.25 and got["pass_cost"] == 2.0 and got["bound_from_costs"] == 0.62
    report({"sessions": [], "tokens": 40, "baseline": got}, argparse.Namespace(json=False), [], "summary")
    text = capsys.readouterr().out
    assert "the bound from the measured acceptance and costs: 1.25x / 2.0 = 0.62x" in text
    assert "speculation cannot pay here" in text and "at most 1.25x a target-only one (it costs 2.0x)" in text
    assert "commit at least 2.0 tokens per session pass at this cost (it commits 1.25)" in text


def test_a_wide_range_that_never_crosses_one_keeps_the_sign(capsys: pytest.CaptureFixture[str]) -> None:
    pairs = [(Timed(40, 1.0, 10), Timed(40, 1.56, 40)), (Timed(40, 1.0, 10), Timed(40, 2.16, 40)),
             (Timed(40, 1.0, 10), Timed(40, 1.58, 40))]
    got = comparison(pairs, None)
    assert got["spread_as_large_as_effect"]
    report({"sessions": [], "tokens": 40, "baseline": got}, argparse.Namespace(json=False), [], "summary")
    text = capsys.readouterr().out
    assert "its sign is not (every pair agrees)" in text and "noise" not in text


def test_the_why_gives_tokens_per_round_and_the_room_for_each_m(capsys: pytest.CaptureFixture[str]) -> None:
    # Acceptance 0.5: a round of M drafts commits 1 + 0.5 + ... + 0.5^M tokens.
    spec = Timed(40, 3.0, 30, proposed=60, accepted=30, rounds=30, session_passes=30)
    base = Timed(40, 2.0, 40, session_passes=40)
    got = comparison([(spec, base)], [True])
    assert got["tokens_per_round_by_m"] == {1: 1.5, 2: 1.75, 3: 1.88, 4: 1.94}
    report({"sessions": [], "tokens": 40, "baseline": got}, argparse.Namespace(json=False), [], "summary")
    text = capsys.readouterr().out
    assert "accepted independently at 50%: a round commits M=1 1.5, M=2 1.75, M=3 1.88, M=4 1.94 tokens" in text
    assert "1.3x needs it below 1.15, 1.35, 1.45, 1.49" in text


def test_target_only_pairs_give_no_bound_by_m() -> None:
    got = comparison([(Timed(40, 1.0, 10), Timed(40, 2.0, 40))], None)
    assert got["tokens_per_round_by_m"] is None
