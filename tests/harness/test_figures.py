"""The speculation bound from acceptance and costs, and its inverse: the acceptance a goal needs."""

from __future__ import annotations

import pytest

from sdcp_fast.harness.figures import acceptance_needed, speedup_bound


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
