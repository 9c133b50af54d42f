"""Speculation limit and escalation counters (sdcp_fast/protocol/control.py, draft §6.5)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sdcp_fast.protocol.control import (
    LOAD_KNEE,
    SpeculationControl,
    is_low,
    load_limit,
    self_decode_permitted,
)
from sdcp_fast.protocol.messages import Action
from tests.protocol.sessionkit import contract


def test_is_low():
    assert is_low(0, 4, None) and is_low(0, 4, 0) and not is_low(1, 4, None)
    assert is_low(1, 4, 50) and not is_low(2, 4, 50) and is_low(3, 4, 100) and not is_low(4, 4, 100)


def test_load_limit():
    assert load_limit(8, 0) == 8 and load_limit(8, LOAD_KNEE) == 8
    assert load_limit(8, 85) == 4 and load_limit(8, 100) == 1 and load_limit(1, 99) == 1
    assert [load_limit(8, x) for x in range(70, 101)] == sorted((load_limit(8, x) for x in range(70, 101)),
                                                                reverse=True)


def test_self_decode_permitted():
    assert not self_decode_permitted(contract(), 0)
    assert self_decode_permitted(contract(self_load=40), 40)
    assert not self_decode_permitted(contract(self_load=40), 41)


def test_initial_cap_clamped_and_reset():
    c = contract(m_max=8)
    assert SpeculationControl(c).m_cap == 8
    assert SpeculationControl(c, 0).m_cap == 1 and SpeculationControl(c, 20).limit() == 8
    ctl = SpeculationControl(c, 4)
    ctl.reset_cap(2)
    assert ctl.m_cap == 2


def test_reduce_halves_and_restore_is_gradual():
    ctl = SpeculationControl(contract(m_max=8, low_rounds=1, fallback=(1, 1, 1, 1)), 8)
    assert ctl.after_round(0, 8, 0).m_cap == 4
    assert ctl.after_round(0, 4, 0).m_cap == 2
    assert [ctl.after_round(1, 2, 0).m_cap for _ in range(8)] == [3, 4, 5, 6, 7, 8, 8, 8]


def test_reduce_rounds_odd_caps_down():
    """§6.5.1: reduce sets m_cap to max(1, floor(m_cap / 2)); an odd cap tells floor from ceiling."""
    for cap, reduced in ((7, 3), (5, 2), (3, 1)):
        ctl = SpeculationControl(contract(m_max=8, low_rounds=1, fallback=(1,)), cap)
        decision = ctl.after_round(0, cap, 0)
        assert decision.action is Action.REDUCE and decision.m_cap == reduced


def test_reduce_floor_is_one():
    ctl = SpeculationControl(contract(m_max=8, low_rounds=1, fallback=(1, 1)), 1)
    assert ctl.after_round(0, 1, 0).m_cap == 1


def test_load_lowers_cap_and_blocks_restore():
    ctl = SpeculationControl(contract(m_max=8), 8)
    assert ctl.after_round(1, 8, 100).m_cap == 1
    assert ctl.after_round(1, 1, 100).m_cap == 1
    assert ctl.after_round(1, 1, 0).m_cap == 2


def test_counters_and_ladder():
    ctl = SpeculationControl(contract(low_rounds=2, fallback=(1, 2, 5)))
    d1 = ctl.after_round(0, 4, 0)
    assert (d1.action, d1.low, ctl.c, ctl.g) == (Action.CONTINUE, 1, 1, 0)
    d2 = ctl.after_round(0, 4, 0)
    assert (d2.action, d2.low, ctl.c, ctl.j) == (Action.REDUCE, 2, 0, 1)
    ctl.after_round(0, 4, 0)
    assert ctl.after_round(0, 4, 0).action is Action.SWITCH
    ctl.after_round(0, 4, 0)
    assert ctl.after_round(0, 4, 0).action is Action.FAIL
    ctl.after_round(0, 4, 0)
    assert ctl.after_round(0, 4, 0).action is Action.FAIL  # nothing left: fail


def test_good_rounds_reset_j_after_r():
    ctl = SpeculationControl(contract(low_rounds=2, fallback=(1, 2)))
    ctl.after_round(0, 4, 0)
    ctl.after_round(0, 4, 0)
    assert ctl.j == 1
    ctl.after_round(1, 4, 0)
    assert ctl.j == 1 and ctl.g == 1 and ctl.c == 0
    ctl.after_round(1, 4, 0)
    assert ctl.j == 0 and ctl.g == 2
    ctl.after_round(0, 4, 0)
    assert ctl.g == 0


def test_self_decode_skipped_advances_j():
    ctl = SpeculationControl(contract(low_rounds=1, fallback=(3, 3, 2), self_load=30))
    assert ctl.after_round(0, 4, 50).action is Action.SWITCH and ctl.j == 3
    ctl = SpeculationControl(contract(low_rounds=1, fallback=(3, 2), self_load=30))
    assert ctl.after_round(0, 4, 30).action is Action.SELF_DECODE and ctl.j == 1
    ctl = SpeculationControl(contract(low_rounds=1, fallback=(3,)))
    assert ctl.after_round(0, 4, 0).action is Action.FAIL


def test_unknown_ladder_value_is_fail():
    ctl = SpeculationControl(contract(low_rounds=1, fallback=(9, 1)))
    assert ctl.after_round(0, 4, 0).action is Action.FAIL
    ctl = SpeculationControl(contract(low_rounds=1, fallback=(0, 1)))
    assert ctl.after_round(0, 4, 0).action is Action.FAIL


@given(st.lists(st.tuples(st.integers(0, 8), st.integers(1, 8), st.integers(0, 100)), max_size=40),
       st.integers(1, 64), st.integers(1, 3))
def test_cap_stays_in_bounds(rounds, m_max, low_rounds):
    ctl = SpeculationControl(contract(m_max=m_max, low_rounds=low_rounds, fallback=(1, 3, 1, 2, 5), self_load=50))
    for accepted, proposed, load in rounds:
        decision = ctl.after_round(min(accepted, proposed), proposed, load)
        assert 1 <= decision.m_cap <= m_max
        assert 0 <= ctl.c < low_rounds and 0 <= ctl.j <= 5


def test_low_rounds_never_grow_m_cap():
    """§6.5.1: m_cap is restored only "when rounds are no longer low": a low round that does
    not escalate leaves it where it is, whatever the load allows."""
    for low_ratio, accepted in ((None, 0), (50, 1)):
        ctl = SpeculationControl(contract(m_max=8, low_rounds=3, low_ratio=low_ratio), m_cap=3)
        for _ in range(2):
            decision = ctl.after_round(accepted, 3, 0)
            assert decision.action is Action.CONTINUE and decision.m_cap == ctl.m_cap == 3
        assert ctl.after_round(3, 3, 0).m_cap == 4  # a good round restores one
