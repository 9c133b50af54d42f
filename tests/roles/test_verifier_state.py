"""Ended sessions give back what they hold (roles/verifier_state.retire_ended): their KV pages
at once, their record after a while or beyond a count, so a long-running verifier's table
stays the size of its open sessions."""

from __future__ import annotations

import asyncio

import pytest

from sdcp_fast.protocol import SdcpProblem
from sdcp_fast.roles.verifier_state import Deadlines, retire_ended
from sdcp_fast.transport.loop import new_loop

from .rolekit import VERIFIER, Rig, contract, proposal, run, sid

S, T, U = sid(1), sid(2), sid(3)


async def _finish(rig: Rig, session: bytes) -> None:
    _, state = await rig.open(session, contract(max_new=3), m_init=2)
    verdict = await rig.drafter.propose(VERIFIER, proposal(state, rig.greedy_after(state, 2)))
    assert verdict.committed == 3


def test_ended_sessions_release_their_pages_then_are_forgotten(tmp_path):
    async def scenario():
        async with Rig(str(tmp_path)) as rig:
            await _finish(rig, S)
            await rig.open(U, contract(max_new=50), m_init=2)  # open: never touched
            released: list[bytes] = []
            table = rig.verifier.sessions
            assert retire_ended(table, released.append, 100.0, keep=60.0) == 0
            assert released == [S] and S in table and U in table
            out = await rig.router.output(VERIFIER, S, 0)  # still answers its output
            assert out.final and len(out.tokens) == 3
            assert retire_ended(table, released.append, 130.0, keep=60.0) == 0
            assert released == [S]  # pages given back once
            assert retire_ended(table, released.append, 160.0, keep=60.0) == 1
            assert S not in table and U in table
            with pytest.raises(SdcpProblem) as exc:
                await rig.router.output(VERIFIER, S, 0)
            assert exc.value.status == 404

    run(scenario())


def test_beyond_the_count_the_oldest_ended_session_goes_first(tmp_path):
    async def scenario():
        async with Rig(str(tmp_path)) as rig:
            table = rig.verifier.sessions
            await _finish(rig, S)
            retire_ended(table, lambda s: None, 10.0, most=1)
            await _finish(rig, T)
            assert retire_ended(table, lambda s: None, 11.0, most=1) == 1
            assert S not in table and T in table

    run(scenario())


def test_a_session_that_left_the_verifier_has_not_ended_and_an_ended_one_is_released_once(tmp_path):
    """The facts LiveSession's docstring names: a cancel sets ``gone`` and leaves the core's
    session as it was (not ended, so nothing retires it twice); a finished one is ended by its
    core, and ``ended`` marks its pages given back."""

    async def scenario():
        async with Rig(str(tmp_path)) as rig:
            await rig.open(T, contract(max_new=50), m_init=2)
            cancelled = rig.verifier.live(T)
            await rig.router.cancel(VERIFIER, T)
            await _finish(rig, S)
            finished = rig.verifier.live(S)
            released: list[bytes] = []
            retire_ended(rig.verifier.sessions, released.append, 5.0)
            return cancelled, finished, released

    cancelled, finished, released = run(scenario())
    assert cancelled.gone is not None and cancelled.gone.status == 404
    assert not cancelled.session.closed and cancelled.ended is None
    assert finished.gone is None and finished.session.closed and finished.ended == 5.0 and released == [S]


# -- Deadlines: one timer for the output long-polls' deadlines -----------------------------------


async def _woken_at(deadlines: Deadlines, delays: list[float]) -> list[float]:
    """Each future's wake-up time after the start, for deadlines ``delays`` from it."""
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    futures = [loop.create_future() for _ in delays]
    woken: dict[int, float] = {}
    for i, (delay, future) in enumerate(zip(delays, futures, strict=True)):
        future.add_done_callback(lambda _, i=i: woken.__setitem__(i, loop.time() - t0))
        deadlines.add(t0 + delay, future)
    await asyncio.wait_for(asyncio.gather(*futures), 5.0)
    return [woken[i] for i in range(len(delays))]


@pytest.mark.parametrize("loop_factory", [asyncio.new_event_loop, new_loop], ids=["asyncio", "transport-loop"])
def test_deadlines_wake_each_future_at_its_own_deadline_in_any_order(loop_factory):
    """Many waits with different deadlines, added out of order (a later one first, then an
    earlier one that must move the timer): each wakes at its deadline, none before it, on
    asyncio's loop and on the transport's (uvloop's when installed, whose clock keeps whole
    milliseconds)."""
    delays = [0.20, 0.05, 0.12, 0.01, 0.05, 0.30, 0.08]

    async def scenario():
        deadlines = Deadlines()
        woken = await _woken_at(deadlines, delays)
        return woken, len(deadlines)

    loop = loop_factory()
    try:
        woken, left = loop.run_until_complete(scenario())
    finally:
        loop.close()
    for delay, at in zip(delays, woken, strict=True):
        assert delay - 0.002 <= at < delay + 1.0, (delay, at)
    assert sorted(range(len(delays)), key=lambda i: (delays[i], i)) == sorted(
        range(len(delays)), key=lambda i: (woken[i], i))
    assert left == 0


def test_deadlines_answered_futures_are_skipped_and_the_timer_moves_on():
    """A future answered before its deadline (a commit woke its poll) is left alone at the
    deadline; a cancelled one too; the later deadlines still fire."""

    async def scenario():
        loop = asyncio.get_running_loop()
        deadlines = Deadlines()
        answered, cancelled, late = loop.create_future(), loop.create_future(), loop.create_future()
        now = loop.time()
        deadlines.add(now + 0.02, answered)
        deadlines.add(now + 0.03, cancelled)
        deadlines.add(now + 0.06, late)
        answered.set_result(None)
        cancelled.cancel()
        await asyncio.wait_for(late, 5.0)
        return late.done(), loop.time() - now

    done, waited = run(scenario())
    assert done and waited >= 0.055


def test_deadlines_rearm_when_an_earlier_deadline_comes_while_waking_or_after_close():
    """The timer follows the earliest deadline: one added by a future's callback while the
    timer's own wake-ups run (as a woken poll that waits again), one earlier than the armed
    deadline, and one added after ``close`` all fire."""

    async def scenario():
        loop = asyncio.get_running_loop()
        deadlines = Deadlines()
        first, again, later, sooner = (loop.create_future() for _ in range(4))
        t0 = loop.time()
        first.add_done_callback(lambda _: deadlines.add(loop.time() + 0.02, again))
        deadlines.add(t0 + 0.01, first)
        deadlines.add(t0 + 1.0, later)
        await asyncio.wait_for(again, 5.0)
        deadlines.add(loop.time() + 0.01, sooner)  # earlier than `later`: the timer moves
        await asyncio.wait_for(sooner, 5.0)
        early = loop.time() - t0
        deadlines.close()
        assert not later.done() and len(deadlines) == 0
        after = loop.create_future()
        deadlines.add(loop.time() + 0.01, after)
        await asyncio.wait_for(after, 5.0)
        return early

    assert run(scenario()) < 0.9
