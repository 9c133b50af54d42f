"""roles/verifier_plan.py alone, without an event loop: tables of sessions and queued rounds and
the pass each one plans; chunked prefill followed over passes; the shared budget's learning."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sdcp_fast.roles.verifier_plan import (
    Limits,
    Plan,
    Queued,
    SessionNeed,
    SharedBudget,
    pending,
    plan,
    self_decode_due,
)

L = Limits(max_batch=8, prefill_chunk=8, prefill_solo=32, shared_budget=8)


def new(key: int, context: int, **kw: Any) -> SessionNeed:
    """A session before its first round's pass."""
    return SessionNeed(key, context, **kw)


def decoding(key: int, **kw: Any) -> SessionNeed:
    """A session past its first round."""
    return SessionNeed(key, 10, prefilled=True, **kw)


CASES = [
    pytest.param([], [], L, 0, Plan(), id="empty queue, no session"),
    pytest.param([], [Queued(decoding(1), 3)], L, 0, Plan(rounds=(0,), shared=True, decoding=True),
                 id="a decoding round alone"),
    pytest.param([new(1, 45)], [], L, 0, Plan(chunks=((0, 32),), prefill=32, waiting=45),
                 id="a long prompt alone gets the solo budget"),
    pytest.param([new(1, 45)], [Queued(decoding(2), 3)], L, 0,
                 Plan(rounds=(0,), chunks=((0, 8),), shared=True, decoding=True, prefill=8, waiting=45),
                 id="beside a decoding round, the shared budget"),
    pytest.param([decoding(2, owes=True), new(1, 45)], [], L, 0,
                 Plan(chunks=((1, 8),), shared=True, prefill=8, waiting=45),
                 id="a proposal owed makes the pass shared"),
    pytest.param([new(1, 45, owes=True)], [], L, 0, Plan(chunks=((0, 32),), prefill=32, waiting=45),
                 id="a proposal owed by a session being chunked does not"),
    pytest.param([new(1, 45)], [], L, 1, Plan(chunks=((0, 8),), shared=True, prefill=8, waiting=45),
                 id="a round fetching its q rows makes the pass shared"),
    pytest.param([decoding(2, self_decoding=True), new(1, 45)], [], L, 0,
                 Plan(self_decoded=(0,), chunks=((1, 8),), shared=True, decoding=True, prefill=8, waiting=45),
                 id="a self-decoding session makes the pass shared"),
    pytest.param([], [Queued(new(i, 3), 2) for i in range(20)], Limits(64, 8, 32, 8), 0,
                 Plan(rounds=tuple(range(20)), shared=True), id="first rounds within M + 1 are not charged"),
    pytest.param([], [Queued(new(i, 4), 2) for i in range(4)], L, 0,
                 Plan(rounds=(0, 1), shared=True, held_back=True, prefill=8),
                 id="a first round over M + 1 is charged in full; one held back is said"),
    pytest.param([], [Queued(new(1, 4), 3), Queued(new(2, 5), 3), Queued(new(3, 5), 3), Queued(new(4, 1), 3)], L, 0,
                 Plan(rounds=(0, 1, 3), shared=True, held_back=True, prefill=5),
                 id="M + 1 is the bound; a later round that fits passes one held back"),
    pytest.param([], [Queued(new(1, 20, fed=16), 3), Queued(new(2, 20, fed=12), 3)], L, 0,
                 Plan(rounds=(0, 1), shared=True, prefill=8), id="what chunks fed is not charged again"),
    pytest.param([new(1, 45)], [Queued(new(1, 45), 3)], L, 0, Plan(chunks=((0, 32),), prefill=32, waiting=45),
                 id="a first round waits for its chunks, not said held back when alone"),
    pytest.param([new(1, 45)], [Queued(new(1, 45), 3), Queued(decoding(2), 3)], L, 0,
                 Plan(rounds=(1,), chunks=((0, 8),), shared=True, held_back=True, decoding=True, prefill=8, waiting=45),
                 id="a first round waits for its chunks, said held back beside a decoding round"),
    pytest.param([new(1, 20)], [Queued(new(1, 20), 3)], L, 0, Plan(rounds=(0,), prefill=20, waiting=20),
                 id="a first round the budget fits feeds the rest and takes no chunk"),
    pytest.param([new(1, 20), new(2, 30), new(3, 12)], [], L, 0,
                 Plan(chunks=((0, 19), (1, 13)), prefill=32, waiting=62),
                 id="prompts share the budget in the order they were opened"),
    pytest.param([new(1, 45)], [Queued(new(2, 6), 2), Queued(decoding(3), 3)], L, 0,
                 Plan(rounds=(0, 1), chunks=((0, 2),), shared=True, decoding=True, prefill=8, waiting=45),
                 id="a first round's charge leaves less for chunks"),
    pytest.param([new(1, 45), new(2, 8), new(3, 8)], [Queued(new(2, 8), 2), Queued(new(3, 8), 2)], L, 0,
                 Plan(rounds=(0,), shared=True, held_back=True, prefill=8, waiting=45),
                 id="a budget spent by first rounds leaves no chunk"),
    pytest.param([], [Queued(decoding(i), 3) for i in range(5)], Limits(2, 8, 32, 8), 0,
                 Plan(rounds=(0, 1), shared=True, decoding=True), id="max_batch bounds the rounds, none said held back"),
    pytest.param([decoding(10 + i, self_decoding=True) for i in range(3)], [Queued(decoding(1), 3)] * 2,
                 Limits(3, 8, 32, 8), 0, Plan(rounds=(0, 1), self_decoded=(0,), shared=True, decoding=True),
                 id="self-decoded rounds after the queued ones, within max_batch"),
    pytest.param([new(i, n, self_decoding=True) for i, n in enumerate([6, 2, 3, 1])], [], L, 0,
                 Plan(self_decoded=(0, 1, 3), shared=True, held_back=True, prefill=8),
                 id="a self-decoded first round is charged beyond its one position"),
    pytest.param([new(1, 45, chunks_failed=True)], [Queued(new(1, 45, chunks_failed=True), 3), Queued(decoding(2), 3)],
                 L, 0, Plan(rounds=(0, 1), shared=True, decoding=True, prefill=45),
                 id="after a failed chunk, the rest in one pass: not held to the budget, counted as fed"),
    pytest.param([new(1, 45, open=False)], [], L, 0, Plan(), id="a session ended or committing is fed no chunk"),
    pytest.param([new(1, 45)], [Queued(new(2, 100), 3), Queued(decoding(3), 3)], Limits(8, 0, 0, 0), 0,
                 Plan(rounds=(0, 1), shared=True, decoding=True, prefill=100),
                 id="prefill_chunk 0: any context in one pass"),
    pytest.param([new(1, 45, fed=8)], [], Limits(8, 8, 0, 8), 0, Plan(chunks=((0, 44),), prefill=36, waiting=37),
                 id="prefill_solo 0: alone, the rest of the context in one chunk"),
]


@pytest.mark.parametrize(("sessions", "queue", "limits", "fetching", "expected"), CASES)
def test_the_plan_of_a_pass(sessions, queue, limits, fetching, expected):
    assert plan(sessions, queue, limits, fetching=fetching) == expected


def _first_round(limits: Limits, *, beside: bool) -> tuple[list[int], list[bool], int]:
    """A 45-token prompt whose first round (M = 3) is queued from its opening, alone or beside a
    decoding session, planned and fed pass after pass: each pass's chunk end, whether the pass
    said it held a round back, and what the pass of its first round was charged."""
    fed, ends, held = 0, [], []
    for _ in range(50):
        me = new(1, 45, fed=fed)
        queue = [Queued(me, 3), *([Queued(decoding(2), 3)] if beside else [])]
        p = plan([me], queue, limits)
        held.append(p.held_back)
        if 0 in p.rounds:
            return ends, held, p.prefill
        assert len(p.chunks) == 1 and p.chunks[0][1] > fed
        fed = p.chunks[0][1]
        ends.append(fed)
    raise AssertionError("the first round never went")


@pytest.mark.parametrize(("limits", "beside", "ends", "charged"), [
    (L, True, [8, 16, 24, 32, 40], 5),  # 5 unfed tokens left: over M + 1, charged
    (L, False, [32], 13),  # alone, the solo budget; the rest fits it with the round
    (Limits(8, 16, 16, 16), False, [16, 32], 13),
    (Limits(8, 8, 32, 64), True, [], 45),  # a budget the shared passes learnt: all of it with the round
    (Limits(8, 7, 7, 7), True, [7, 14, 21, 28, 35, 42], 0),  # 3 tokens left: within M + 1, free
    (Limits(8, 0, 0, 0), True, [], 45),  # no chunks: the whole context with the round
])
def test_a_long_context_is_fed_over_passes_until_its_first_round_fits(limits, beside, ends, charged):
    got_ends, held, got_charge = _first_round(limits, beside=beside)
    assert (got_ends, got_charge) == (ends, charged)
    assert held == [beside] * len(ends) + [False]  # held back only beside a decoding round, and not once it goes


def test_pending_says_whether_a_pass_is_due_without_a_queued_round():
    assert not pending([], 8)
    assert not pending([decoding(1, owes=True), new(2, 8)], 8)  # 8 tokens: its first round feeds them
    assert pending([new(2, 9)], 8) and pending([decoding(1, self_decoding=True)], 8)
    assert not pending([new(2, 9)], 0) and not pending([new(2, 9, open=False)], 8)


@pytest.mark.parametrize(("opened", "now", "idle", "due"), [
    (10.0, 10.0, 0.0, True), (10.0, 14.9, 5.0, False), (10.0, 15.0, 5.0, True), (10.0, 1e9, None, False)])
def test_self_decoding_is_due_after_idle_seconds_unassigned(opened, now, idle, due):
    assert self_decode_due(opened, now, idle) is due


def _taught(budget: SharedBudget, steps) -> list[int]:
    values = []
    for took, prefill, held_back, rounds in steps:
        budget.adapt(took, prefill, held_back=held_back, rounds=rounds)
        values.append(budget.value)
    return values


@pytest.mark.parametrize(("chunk", "solo", "steps", "values"), [
    # Nothing learnt before a pass of decoding rounds alone was timed.
    (32, 128, [(0.5, 32, False, 1)], [32]),
    # 1 s a round alone; a pass of 4 rounds is compared with 4 s.
    (32, 128, [(1.0, 0, False, 1), (4.4, 32, False, 4), (4.4, 32, False, 4), (4.4, 64, False, 4)], [32, 64, 64, 128]),
    # Short first rounds seldom add up to the budget: a pass that held one back counts as full.
    (32, 128, [(1.0, 0, False, 1), (1.1, 30, False, 1), (1.1, 30, True, 1), (2.0, 3, True, 1)], [32, 32, 64, 32]),
    # prefill_solo 0: the budget grows up to 16 chunks (as the CPU's defaults, 512 / 32).
    (8, 0, [(1.0, 0, False, 1)] + [(1.0, 1000, False, 1)] * 6, [8, 16, 32, 64, 128, 128, 128]),
    # prefill_chunk 0: a context in one pass, nothing to learn.
    (0, 0, [(1.0, 0, False, 1), (1.0, 100, False, 1)], [0, 0]),
])
def test_the_shared_budget_learns_from_pass_times(chunk, solo, steps, values):
    assert _taught(SharedBudget(chunk, solo), steps) == values


@settings(deadline=None)  # a loaded machine's pause is no failure of the plan
@given(st.lists(st.tuples(st.integers(1, 80), st.integers(0, 80), st.booleans(), st.booleans(), st.booleans()),
                max_size=12),
       st.lists(st.tuples(st.integers(0, 11), st.integers(0, 8)), max_size=12),
       st.integers(1, 6), st.integers(0, 16), st.integers(0, 48), st.integers(0, 2))
def test_a_plan_stays_within_its_limits(rows, queued, max_batch, chunk, solo, fetching):
    """Whatever the sessions: at most ``max_batch`` rounds, each round and session once, chunks
    only of sessions being chunked and none past their context's last token but one, and the
    tokens charged or chunked within the pass's budget (a failed chunk's rest aside)."""
    sessions = [SessionNeed(i, context, min(fed, context - 1), prefilled, owes=owes, self_decoding=sd)
                for i, (context, fed, prefilled, owes, sd) in enumerate(rows)]
    queue = [Queued(sessions[i] if i < len(sessions) else new(100 + i, 5), m) for i, m in queued]
    limits = Limits(max_batch, chunk, solo and max(solo, chunk), chunk)
    p = plan(sessions, queue, limits, fetching=fetching)
    assert len(p.rounds) + len(p.self_decoded) <= max_batch
    assert list(p.rounds) == sorted(set(p.rounds)) and list(p.self_decoded) == sorted(set(p.self_decoded))
    for i, end in p.chunks:
        s = sessions[i]
        assert s.fed < end <= s.context - 1 and not s.prefilled and s.unfed > chunk > 0
    budget = (limits.shared_budget if p.shared else limits.prefill_solo) or None
    if chunk and budget is not None:
        assert p.prefill <= budget
    if p.held_back:
        assert p.shared and chunk
