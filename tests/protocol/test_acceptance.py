"""Pure-Python sampling profile and acceptance rules (sdcp_fast/protocol/acceptance.py)."""

from __future__ import annotations

import math
import random
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sdcp_fast.protocol.acceptance import (
    RoundResult,
    argmax,
    check_q,
    greedy,
    inverse_cdf,
    profile_distribution,
    q_of_tokens,
    speculative,
)
from sdcp_fast.protocol.messages import Sampling
from sdcp_fast.protocol.problems import BadProposal


def test_argmax_ties_go_to_smallest_id():
    assert argmax([0.1, 0.5, 0.5, 0.2]) == 1
    assert argmax([3.0]) == 0


def test_profile_absent_is_softmax():
    p = profile_distribution([0.0, math.log(3.0)], None)
    assert p == pytest.approx([0.25, 0.75])
    assert profile_distribution([1.0, 2.0], Sampling(top_p_milli=1000, top_k=0)) == pytest.approx(
        profile_distribution([1.0, 2.0], None))


def test_profile_temperature_zero_is_one_hot_smallest_tie():
    assert profile_distribution([1.0, 5.0, 5.0], Sampling(temperature_milli=0, top_k=1)) == [0.0, 1.0, 0.0]


def test_profile_temperature_sharpens():
    flat = profile_distribution([0.0, 1.0], Sampling(temperature_milli=1000))
    sharp = profile_distribution([0.0, 1.0], Sampling(temperature_milli=500))
    assert sharp[1] > flat[1]
    assert sharp == pytest.approx(profile_distribution([0.0, 2.0], None))


def test_top_k_boundary_ties_keep_smallest_ids():
    p = profile_distribution([1.0, 2.0, 2.0, 2.0], Sampling(top_k=2))
    assert p == pytest.approx([0.0, 0.5, 0.5, 0.0])


def test_top_p_keeps_shortest_prefix_reaching_mass():
    logits = [math.log(x) for x in (0.1, 0.2, 0.3, 0.4)]
    assert profile_distribution(logits, Sampling(top_p_milli=700)) == pytest.approx([0, 0, 0.3 / 0.7, 0.4 / 0.7])
    assert profile_distribution(logits, Sampling(top_p_milli=400)) == pytest.approx([0, 0, 0, 1])
    assert profile_distribution(logits, Sampling(top_p_milli=1)) == pytest.approx([0, 0, 0, 1])
    assert profile_distribution(logits, Sampling(top_p_milli=0)) == pytest.approx([0.1, 0.2, 0.3, 0.4])
    # Tie at the boundary: (prob desc, id asc) puts id 1 before id 2.
    tied = [math.log(x) for x in (0.2, 0.4, 0.4)]
    assert profile_distribution(tied, Sampling(top_p_milli=300)) == pytest.approx([0, 1, 0])
    assert profile_distribution(tied, Sampling(top_p_milli=500)) == pytest.approx([0, 0.5, 0.5])


def test_top_p_applies_after_top_k():
    logits = [math.log(x) for x in (0.1, 0.2, 0.3, 0.4)]
    # top-k 2 leaves (3/7, 4/7); top-p 0.5 then keeps the largest only.
    assert profile_distribution(logits, Sampling(top_k=2, top_p_milli=500)) == pytest.approx([0, 0, 0, 1])


def test_ranking_uses_logits_not_rounded_probabilities():
    # exp() rounds both to the same probability; the larger logit still ranks first.
    assert profile_distribution([-2.2e-44, 0.0], Sampling(top_p_milli=1)) == [0.0, 1.0]
    assert profile_distribution([-2.2e-44, 0.0], Sampling(top_k=1)) == [0.0, 1.0]


def test_profile_rejects_empty_row():
    with pytest.raises(ValueError):
        profile_distribution([], None)


@given(st.lists(st.floats(-20, 20), min_size=1, max_size=12),
       st.builds(Sampling, temperature_milli=st.one_of(st.none(), st.integers(0, 3000)),
                 top_k=st.one_of(st.none(), st.integers(0, 15)),
                 top_p_milli=st.one_of(st.none(), st.integers(0, 1000))))
def test_profile_is_a_distribution_keeping_the_most_probable(logits, sampling):
    p = profile_distribution(logits, sampling)
    assert math.fsum(p) == pytest.approx(1.0) and min(p) >= 0.0
    # The most probable token (ties to the smallest id) always survives.
    assert p[argmax(logits)] == max(p)


def test_inverse_cdf_ascending_ids():
    w = [0.0, 1.0, 0.0, 3.0]
    assert inverse_cdf(w, 0.0) == 1
    assert inverse_cdf(w, 0.2499) == 1
    assert inverse_cdf(w, 0.25) == 3
    assert inverse_cdf(w, 1.0 - 2**-53) == 3
    assert inverse_cdf([2.0, 0.0], 0.99999) == 0
    with pytest.raises(ValueError):
        inverse_cdf([0.0, 0.0], 0.5)


def test_inverse_cdf_rounding_at_the_top_falls_to_last_positive():
    assert inverse_cdf([0.1, 0.2, 0.0], 1.0) == 1


def test_greedy_rule():
    rows = [[0, 1, 0], [1, 0, 0], [0, 0, 1]]
    assert greedy(rows, [1, 0]) == RoundResult(2, 2)
    assert greedy(rows, [1, 2]) == RoundResult(1, 0)
    assert greedy(rows, [0, 0]) == RoundResult(0, 1)
    assert greedy([[0.5, 0.5]], []) == RoundResult(0, 0)
    with pytest.raises(ValueError):
        greedy(rows, [1])


def test_speculative_accepts_when_p_dominates():
    p = [[0.0, 1.0], [0.0, 1.0], [0.3, 0.7]]
    q = [[0.5, 0.5], [0.5, 0.5]]
    assert speculative(p, q, [1, 1], lambda i, k: 0.999) == RoundResult(2, 1)
    assert speculative(p, q, [1, 1], lambda i, k: 0.0 if k == 0 else 0.29) == RoundResult(2, 0)


def test_speculative_rejection_draws_from_residual_with_its_uniform():
    p = [[0.6, 0.4, 0.0]]
    q = [[0.1, 0.8, 0.1]]
    seen = []

    def uniform(i, purpose):
        seen.append((i, purpose))
        return 0.9 if purpose == 0 else 0.99

    # r = 0.9 >= p/q = 0.5 rejects; residual is (0.5, 0, 0) -> token 0 whatever the draw.
    assert speculative(p + [[1.0, 0, 0]], q, [1], uniform) == RoundResult(0, 0)
    assert seen == [(1, 0), (1, 1)]


def test_speculative_equal_rows_reject_by_rounding_draw_from_p():
    p = [[0.5, 0.5], [1.0, 0.0]]
    q = [[0.5, 0.5]]
    # p/q == 1, so r < 1 always accepts; force the rounding branch with r = 1.
    assert speculative(p, q, [0], lambda i, k: 1.0 if k == 0 else 0.75) == RoundResult(0, 1)


def test_speculative_checks_q_before_any_uniform():
    def uniform(i, purpose):
        raise AssertionError("a random value was drawn")

    with pytest.raises(BadProposal):
        speculative([[1.0, 0.0], [1.0, 0.0]], [[1.0, 0.0]], [1], uniform)
    with pytest.raises(ValueError):
        speculative([[1.0]], [[1.0]], [0], uniform)


def test_check_q():
    check_q([0.1, 1.0], 2)
    for bad in ([0.1], [0.0, 1.0], [float("nan"), 1.0], [-1.0, 1.0], [float("inf"), 1.0]):
        with pytest.raises(BadProposal):
            check_q(bad, 2)


def test_q_of_tokens_reads_little_endian_rows():
    rows = struct.pack("<6f", 0.1, 0.2, 0.7, 0.5, 0.25, 0.25)
    assert q_of_tokens(rows, [2, 0], 3) == pytest.approx([0.7, 0.5])
    for tokens, vocab in (([2, 0], 2), ([3, 0], 3), ([2], 3), ([0, 0], 0)):
        with pytest.raises(BadProposal):
            q_of_tokens(rows, tokens, vocab)


def _chi2(counts, probs, n):
    stat, df = 0.0, -1
    pending_e = pending_o = 0.0
    for o, p in zip(counts, probs, strict=True):
        pending_e += p * n
        pending_o += o
        if pending_e >= 5:  # merge bins with expected count < 5 (vLLM's rejection-sampler test)
            stat += (pending_o - pending_e) ** 2 / pending_e
            df += 1
            pending_e = pending_o = 0.0
    return stat, max(df, 1)


def test_rule2_output_follows_target_distribution():
    """With exact q, the first emitted token is distributed as p[1] (§6.4, [LEVIATHAN])."""
    rng = random.Random(1234)
    v = 16
    p1 = [rng.random() ** 3 for _ in range(v)]
    p1 = [x / sum(p1) for x in p1]
    q1 = [rng.random() for _ in range(v)]
    q1 = [x / sum(q1) for x in q1]
    p2 = [1.0 / v] * v
    n = 20000
    counts = [0] * v
    accepted = 0
    for _ in range(n):
        x = rng.choices(range(v), weights=q1)[0]
        result = speculative([p1, p2], [q1], [x], lambda i, k: rng.random())
        first = x if result.accepted == 1 else result.next_token
        counts[first] += 1
        accepted += result.accepted
    stat, df = _chi2(counts, p1, n)
    assert stat < df + 10 * math.sqrt(2 * df)
    # The acceptance rate is sum(min(p, q)).
    rate = sum(min(a, b) for a, b in zip(p1, q1, strict=True))
    assert abs(accepted / n - rate) < 4 * math.sqrt(rate * (1 - rate) / n)
