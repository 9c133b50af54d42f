"""The demo's report of the speedup: the median with its range, the flag when the range is as
wide as the effect, and the why (per session pass: tokens, time, the bound from them, and what
it would take when speculation cannot pay); each session alone (B = 1) beside the batched
figure."""

from __future__ import annotations

import argparse

import pytest

from sdcp_fast.benchlib.speedup import Timed, comparison, each_alone
from sdcp_fast.cli._demo_report import report


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


def _alone(identical: list[bool]) -> dict:
    pairs = [(Timed(12, 0.1, 4, proposed=8, accepted=6, rounds=4), Timed(12, 0.3, 12)),
             (Timed(12, 0.4, 12, proposed=8, accepted=0, rounds=4), Timed(12, 0.2, 12))]
    return each_alone(pairs, ["the copy prompt", "a chat prompt"], identical)


def test_each_session_alone_is_printed_beside_the_batched_figure(capsys: pytest.CaptureFixture[str]) -> None:
    batched = comparison([(Timed(24, 1.0, 10), Timed(24, 0.9, 24))], [True, True])
    out = {"sessions": [{"prompt": "a", "text": "x"}, {"prompt": "b", "text": "y"}], "tokens": 24,
           "baseline": batched, "alone": _alone([True, True])}
    assert report(out, argparse.Namespace(json=False), ["", ""], "summary") == 0
    text = capsys.readouterr().out
    assert "each session alone (B = 1: one session in flight), 2 interleaved pairs" in text
    assert "the copy prompt" in text and "120.0 tok/s" in text and "40.0 tok/s" in text and "3.00x" in text
    assert "per-session tokens/s: speculative 75.0 (range 30.0-120.0), target-only 50.0 (range 40.0-60.0)" in text
    assert "speedup at B = 1 1.75x (median of 2; range 0.5-3.0x" in text
    side = text[text.index("speedup over target-only decoding, median (range):"):]
    assert "batched (2 sessions decoded together)    0.9x (0.9-0.9x)" in side
    assert "each session alone (B = 1)               1.75x (0.5-3.0x)" in side


def test_a_session_alone_unlike_its_target_only_run_fails_the_demo(capsys: pytest.CaptureFixture[str]) -> None:
    out = {"sessions": [], "tokens": 24, "baseline": None, "alone": _alone([True, False])}
    assert report(out, argparse.Namespace(json=True), [], "summary") == 1
    assert report(out, argparse.Namespace(json=False), [], "summary") == 1
    assert "a session decoded alone differs from its target-only greedy decoding" in capsys.readouterr().err
