"""The speedup over target-only decoding: pairs interleaved with the order swapped, the median
with its range, the figures per session pass, each session alone (B = 1); the speculation bound from acceptance and costs,
and its inverse: the acceptance a goal needs."""

from __future__ import annotations

import pytest

from sdcp_fast.benchlib.speedup import (
    Timed,
    acceptance_needed,
    combined,
    comparison,
    each_alone,
    from_rates,
    interleaved,
    speedup_bound,
    spread,
)


def test_bound_is_tokens_per_round_over_the_rounds_cost() -> None:
    # a = 0.5, M = 2: 1 + 0.5 + 0.25 = 1.75 tokens per round; the round costs a 1.25x pass
    # plus 2 drafted tokens at 0.1 of a pass each.
    assert speedup_bound(0.5, 2, 0.1, 1.25, 1.0) == pytest.approx(1.75 / 1.45)
    assert speedup_bound(1.0, 3, 0.0, 2.0, 1.0) == 2.0
    assert speedup_bound(0.5, 0, 0.0, 1.0, 1.0) is None


def test_acceptance_needed_inverts_the_bound() -> None:
    a = acceptance_needed(1.3, 2, 0.0, 1.2, 1.0)
    assert a is not None and speedup_bound(a, 2, 0.0, 1.2, 1.0) == pytest.approx(1.3, abs=1e-6)
    assert acceptance_needed(1.3, 4, 0.0, 4.0, 1.0) is None  # 5 tokens / 4 passes at most
    assert acceptance_needed(0.9, 1, 0.0, 1.1, 1.0) == 0.0  # even rejecting everything


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


def test_target_only_pairs_give_no_bound_by_m() -> None:
    got = comparison([(Timed(40, 1.0, 10), Timed(40, 2.0, 40))], None)
    assert got["tokens_per_round_by_m"] is None


def test_a_bench_run_pairs_repeat_i_of_each_side() -> None:
    assert from_rates([30.0, 20.0, 24.0], [10.0, 10.0, 12.0, 9.0]) == [3.0, 2.0, 2.0]
    assert from_rates([30.0], [0.0]) == []  # a side with nothing measured pairs with nothing
    got = spread(from_rates([30.0, 22.0, 24.0], [10.0, 10.0, 12.0]))
    assert (got["speedup"], got["speedup_min"], got["speedup_max"]) == (2.2, 2.0, 3.0)
    assert not got["spread_as_large_as_effect"]


def test_runs_one_after_another_combine_into_one() -> None:
    got = combined([Timed(10, 1.0, 5, proposed=8, accepted=4, rounds=2), Timed(20, 2.0, 6, session_passes=9)])
    assert got == Timed(30, 3.0, 11, proposed=8, accepted=4, rounds=2, session_passes=14)


def test_each_session_alone_gives_per_session_rates_and_the_speedup_range() -> None:
    # Two sessions alone, one pair each then a second round: 20 and 10 tokens.
    pairs = [(Timed(20, 1.0, 10, proposed=20, accepted=10, rounds=10), Timed(20, 2.0, 20)),
             (Timed(10, 1.0, 10, proposed=20, accepted=0, rounds=10), Timed(10, 0.5, 10)),
             (Timed(20, 0.8, 8, proposed=16, accepted=12, rounds=8), Timed(20, 2.0, 20))]
    got = each_alone(pairs, ["copy", "chat", "copy"], [True, True, True])
    assert (got["speedup"], got["speedup_min"], got["speedup_max"], got["repeats"]) == (2.0, 0.5, 2.5, 3)
    assert got["spread_as_large_as_effect"]  # 0.5-2.5x around 2x: the chat session loses
    assert got["tokens_per_s_per_session"] == {"speculative": {"median": 20.0, "min": 10.0, "max": 25.0},
                                               "target_only": {"median": 10.0, "min": 10.0, "max": 20.0}}
    assert got["acceptance"] == round(22 / 56, 3)
    assert [(p["session"], p["first"], p["tokens"], p["speedup"]) for p in got["pairs"]] == [
        ("copy", "speculative", 20, 2.0), ("chat", "target-only", 10, 0.5), ("copy", "speculative", 20, 2.5)]
    assert got["pairs"][1]["speculative_tokens_per_s"] == 10.0 and got["pairs"][1]["target_only_tokens_per_s"] == 20.0
    assert got["identical_output"] == [True, True, True]
