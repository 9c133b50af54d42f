"""The router's fail-over (roles/router_recovery.py, §6.9) when its target is in trouble too:
a target that died since its last status report is passed over for the next live one, and a
restarted verifier that refuses its session's open (the log moved past it) gets the session
failed over by the stall probe, with no output reader to notice."""

from __future__ import annotations

import asyncio

from sdcp_fast.cache import object_uri
from sdcp_fast.protocol.commitlog import CommitRecord, FenceRecord
from sdcp_fast.protocol.messages import ROLE_VERIFIER
from sdcp_fast.protocol.status_table import choose_verifier
from sdcp_fast.roles.router import SessionSpec
from sdcp_fast.transport.base import Response

from .rolekit import (
    DRAFTER,
    PROMPT,
    ROUTER,
    SCOPE,
    STANDBY,
    VERIFIER,
    Failover,
    greedy,
    run,
    sid,
    status,
    until,
)

THIRD = "inproc://third/"
PAUSED = "inproc://paused/"  # chosen before STANDBY at equal load


def test_a_failover_whose_target_is_dead_too_moves_the_stream_to_the_next_live_verifier(tmp_path):
    """The active verifier restarts after round 3 and no longer knows the session; the output
    reader hears so and fails it over. The first choice, STANDBY, died since its last status
    report: the fail-over goes on to THIRD, and the stream ends with the whole greedy output,
    never with the dead target's connection error."""
    parts = Failover(str(tmp_path))
    network, clock = parts.network, parts.clock
    paused: list[int] = []
    session = sid(91)

    def cut_after_round_3(info):
        if info.round == 3 and not paused:
            paused.append(info.round)
            network.unregister(VERIFIER)  # its output poll fails until it is back, restarted

    async def scenario():
        router = parts.router()
        first, drafter = parts.verifier(VERIFIER, cut_after_round_3), parts.drafter()
        third = parts.verifier(THIRD)
        roles = [first, drafter, third]
        for role in (first, drafter):
            await role.start()
        try:
            await until(lambda: router.table.status(DRAFTER, clock()) is not None)
            await router.open(SessionSpec(PROMPT, max_new=30, session=session))
            reader = asyncio.create_task(router.text(session))
            await until(lambda: paused)
            await first.close()
            # STANDBY reported and died: its status is live, nobody answers there.
            router.table.report(status(STANDBY, ROLE_VERIFIER), clock())
            await third.start()
            await third.report_status()
            assert choose_verifier(router.table, clock(), exclude=(VERIFIER,)) == STANDBY
            restarted = parts.verifier(VERIFIER)  # knows no session: the reader is told so
            roles.append(restarted)
            await restarted.start()
            tokens, _ = await reader
            return tokens, router.sessions[session]
        finally:
            for role in roles:
                await role.close()

    try:
        tokens, routed = run(scenario(), timeout=60.0)
    finally:
        parts.mlc.close()
    assert routed.verifier == THIRD and routed.epoch == 3  # STANDBY's fence, then THIRD's
    assert tokens == greedy(parts.target, PROMPT, 30)


def test_a_stall_probe_refused_by_a_restarted_verifier_fails_the_session_over(tmp_path):
    """Nobody reads the session's output. Its verifier commits three rounds, then restarts
    together with the drafter's death; the watchdog's probe re-sends the epoch-1 open, which the
    restarted verifier refuses (sdcp-stale-epoch: the log moved past it). The session is
    failed over from the log's last record, to STANDBY, and to the restarted verifier itself
    when no other is live."""
    for others in ((STANDBY,), ()):
        parts = Failover(str(tmp_path / f"others{len(others)}"))
        network, clock = parts.network, parts.clock
        stopped: list[int] = []
        session = sid(92)

        def cut_after_round_3(info, network=network, stopped=stopped):
            if info.round == 3 and not stopped:
                stopped.append(info.round)
                network.unregister(VERIFIER)
                network.unregister(DRAFTER)

        async def scenario(parts=parts, network=network, clock=clock, stopped=stopped, session=session,
                           others=others, cut=cut_after_round_3):
            router = parts.router()
            first, drafter = parts.verifier(VERIFIER, cut), parts.drafter()
            roles = [first, drafter]
            for role in roles:
                await role.start()
            try:
                await until(lambda: router.table.status(DRAFTER, clock()) is not None)
                await router.open(SessionSpec(PROMPT, max_new=30, session=session))
                await until(lambda: stopped)
                for role in (first, drafter):
                    await role.close()
                clock.advance(40.0)  # past the watchdog's period; the restarted verifier reports again
                restarted = parts.verifier(VERIFIER)
                roles.append(restarted)
                await restarted.start()
                await restarted.report_status()
                for uri in others:
                    other = parts.verifier(uri)
                    roles.append(other)
                    await other.start()
                    await other.report_status()
                await router.sweep()
                routed = router.sessions[session]
                held = {role.uri: role.sessions.get(session) if session in role.sessions else None for role in roles[2:]}
                return routed, routed.opened, held
            finally:
                for role in roles:
                    await role.close()

        try:
            routed, opened, held = run(scenario(), timeout=60.0)
            records = parts.mlc.logs.log(object_uri(SCOPE, session, "commit_log")).read().records
        finally:
            parts.mlc.close()
        last = [r for r in records if isinstance(r, CommitRecord)][-1]
        to = others[0] if others else VERIFIER
        assert (routed.verifier, routed.epoch, opened.epoch) == (to, 2, 2), others
        assert opened.resume is not None and opened.resume.committed == last.committed
        assert held[to] is not None and held[to].committed == last.committed


def test_a_verifier_that_stops_answering_after_an_open_holds_no_fail_over_back(tmp_path):
    """The verifier answers a session-open, then stops answering (SIGSTOP) before it is told
    the session's drafter. The open still returns, and once its status expired the sweep fails
    the session over to STANDBY, where the stream ends with the whole greedy output: the
    unanswered call held the router's lock, and with it every fail-over, until the verifier
    was continued."""
    parts = Failover(str(tmp_path))
    network, clock = parts.network, parts.clock
    session = sid(93)
    stopped = asyncio.Event()
    held: list[str] = []

    async def scenario():
        router = parts.router()
        router.recovery.call_bound = 0.2
        first, drafter = parts.verifier(VERIFIER), parts.drafter()
        inner = first.handler

        async def stops_after_the_open(request):
            if stopped.is_set() or (request.method == "PUT" and request.path.endswith("/drafter")):
                stopped.set()
                held.append(request.path)
                await asyncio.Event().wait()  # never answered, as by a stopped process
            return await inner(request)

        network.register(VERIFIER, stops_after_the_open)
        roles = [first, drafter]
        for role in roles:
            await role.start()
        try:
            await until(lambda: router.table.status(DRAFTER, clock()) is not None)
            await asyncio.wait_for(router.open(SessionSpec(PROMPT, max_new=30, session=session)), 20.0)
            await first.close()  # it reports no status any more
            clock.advance(11.0)
            standby = parts.verifier(STANDBY)
            roles.append(standby)
            await standby.start()
            await standby.report_status()
            await drafter.report_status()
            await asyncio.wait_for(router.sweep(), 20.0)
            tokens, _ = await asyncio.wait_for(router.text(session), 20.0)
            return tokens, router.sessions[session]
        finally:
            for role in roles:
                await role.close()

    try:
        tokens, routed = run(scenario(), timeout=60.0)
    finally:
        parts.mlc.close()
    assert held and routed.verifier == STANDBY and routed.epoch == 2
    assert tokens == greedy(parts.target, PROMPT, 30)


def test_an_open_at_a_verifier_that_stopped_answering_goes_to_the_next_behind_a_fence(tmp_path):
    """The verifier the router picks for a new session stopped answering (SIGSTOP) before its
    status expired. The open is given up and made at STANDBY, at epoch 2 behind a fence, so that
    the stopped one can append nothing if it took the open; the stream ends with the whole
    greedy output."""
    parts = Failover(str(tmp_path))
    network, clock = parts.network, parts.clock
    session = sid(94)
    held: list[str] = []

    async def never_answers(request):
        held.append(request.path)
        await asyncio.Event().wait()

    async def scenario():
        router = parts.router()
        router.recovery.call_bound = 0.2
        drafter = parts.drafter()
        standby = parts.verifier(STANDBY)
        roles = [drafter, standby]
        for role in roles:
            await role.start()
        try:
            await until(lambda: router.table.status(DRAFTER, clock()) is not None)
            await until(lambda: router.table.status(STANDBY, clock()) is not None)
            router.table.report(status(PAUSED, ROLE_VERIFIER), clock())
            network.register(PAUSED, never_answers)
            assert choose_verifier(router.table, clock()) == PAUSED
            routed = await asyncio.wait_for(router.open(SessionSpec(PROMPT, max_new=30, session=session)), 20.0)
            tokens, _ = await asyncio.wait_for(router.text(session), 20.0)
            return tokens, routed
        finally:
            for role in roles:
                await role.close()

    try:
        tokens, routed = run(scenario(), timeout=60.0)
        records = parts.mlc.logs.log(object_uri(SCOPE, session, "commit_log")).read().records
    finally:
        parts.mlc.close()
    assert held == ["sessions"] and routed.verifier == STANDBY and routed.epoch == 2
    assert records[0] == FenceRecord(epoch=2)
    assert tokens == greedy(parts.target, PROMPT, 30)


def test_a_session_failed_over_after_its_last_round_ends_at_the_router(tmp_path):
    """Nobody reads the session; its verifier goes away right after committing the last
    round, before the router heard of its end. The fail-over resumes it at its end: the router marks it done and fails it over no
    more when STANDBY goes away in turn."""
    parts = Failover(str(tmp_path))
    network, clock = parts.network, parts.clock
    session = sid(95)

    async def scenario():
        router = parts.router()

        async def no_events(request):  # the verifier's finish event never arrives
            return Response(503) if request.path == "events" else await router.handler(request)

        network.register(ROUTER, no_events)
        first, drafter = parts.verifier(VERIFIER), parts.drafter()
        roles = [first, drafter]
        for role in roles:
            await role.start()
        try:
            await until(lambda: router.table.status(DRAFTER, clock()) is not None)
            await router.open(SessionSpec(PROMPT, max_new=12, session=session))
            await until(lambda: session in first.sessions and first.sessions.get(session).committed == 12)
            network.unregister(VERIFIER)
            await first.close()
            clock.advance(11.0)
            standby = parts.verifier(STANDBY)
            roles.append(standby)
            await standby.start()
            await standby.report_status()
            await drafter.report_status()
            await router.sweep()
            routed = router.sessions[session]
            moved = (routed.verifier, routed.epoch, routed.done)
            clock.advance(11.0)  # STANDBY's status expires too
            third = parts.verifier(THIRD)
            roles.append(third)
            await third.start()
            await third.report_status()
            await router.sweep()
            return moved, (routed.verifier, routed.epoch)
        finally:
            for role in roles:
                await role.close()

    try:
        moved, after = run(scenario(), timeout=60.0)
    finally:
        parts.mlc.close()
    assert moved == (STANDBY, 2, True)
    assert after == (STANDBY, 2)
