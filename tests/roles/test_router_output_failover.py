"""The router's output stream across a fail-over from a verifier that stopped answering
without a reset (SIGSTOP, a partition that drops packets): the output poll held by the old
verifier is given up when the session moves, and the stream goes on from the new verifier
(§6.7, §6.9)."""

from __future__ import annotations

import asyncio

from sdcp_fast.protocol import Action, Sampling
from sdcp_fast.protocol.messages import RULE_SPECULATIVE
from sdcp_fast.roles.router import SessionSpec
from sdcp_fast.transport.base import Request, Response

from .rolekit import DRAFTER, PROMPT, Failover, run, sid, until

ACTIVE = "inproc://verifier/active/"
STANDBY = "inproc://verifier/standby/"
S = sid(77)


class Stoppable:
    """A verifier's handler that can be stopped as by SIGSTOP: requests that arrive while it
    is stopped get no answer, and no error, until it is continued."""

    def __init__(self, inner):
        self.inner = inner
        self.running = asyncio.Event()
        self.running.set()
        self.held = 0

    async def handler(self, request: Request) -> Response:
        if not self.running.is_set():
            self.held += 1
            await self.running.wait()
        return await self.inner(request)


def test_the_output_stream_leaves_a_stopped_verifier_at_the_fail_over(tmp_path):
    parts = Failover(str(tmp_path))
    clock, network, mlc = parts.clock, parts.network, parts.mlc
    stoppable: list[Stoppable] = []
    standby_rounds: list[float] = []

    def stop_after_round_3(info):
        if info.round == 3 and stoppable[0].running.is_set():
            stoppable[0].running.clear()

    async def scenario():
        loop = asyncio.get_running_loop()
        router = parts.router()
        active = parts.verifier(ACTIVE, stop_after_round_3, register=False)
        stoppable.append(Stoppable(active.handler))
        network.register(ACTIVE, stoppable[0].handler)
        standby = parts.verifier(STANDBY, lambda info: standby_rounds.append(loop.time()), register=False)
        network.register(STANDBY, standby.handler)
        drafter = parts.drafter()
        roles = [active, drafter, standby]
        for role in roles[:2]:
            await role.start()
        received: list[tuple[float, int, int]] = []  # (when, epoch, tokens)
        try:
            await until(lambda: router.table.status(DRAFTER, clock()) is not None)
            spec = SessionSpec(PROMPT, max_new=40, rule=RULE_SPECULATIVE, session=S,
                               sampling=Sampling(temperature_milli=1000, seed=76))
            routed = await router.open(spec)
            assert routed.verifier == ACTIVE
            await standby.start()

            async def read():
                async for out in router.output(S):
                    received.append((loop.time(), out.epoch, len(out.tokens)))
                    if out.final:
                        return out.finish
                return None

            stream = asyncio.create_task(read())
            # Stopped, with the router's output poll held there.
            await until(lambda: stoppable[0].held > 0 and not stoppable[0].running.is_set(), seconds=20.0)
            before = sum(n for _, _, n in received)
            clock.advance(11.0)  # the stopped verifier's status expires; the others report again
            await standby.report_status()
            await drafter.report_status()
            await router.sweep()
            assert routed.verifier == STANDBY and routed.epoch == 2
            done, _ = await asyncio.wait({stream}, timeout=20.0)
            stoppable[0].running.set()  # continued: whatever it answers late must not reach the stream
            finish = await asyncio.wait_for(stream, 20.0) if done else None
            return before, received, finish, list(standby.sessions.get(S).output(0).tokens)
        finally:
            stoppable[0].running.set()
            for role in roles:
                await role.close()
            await router.close()

    try:
        before, received, finish, at_standby = run(scenario(), timeout=60.0)
    finally:
        mlc.close()
    assert finish == Action.FINISH, f"the stream never left the stopped verifier ({received})"
    assert sum(n for _, _, n in received) == len(at_standby) == 40
    assert before < 40 and standby_rounds
    # The new verifier's first commit reaches the client at once (a bound generous for a loaded
    # machine: held by the stopped verifier, it would wait until that one continued).
    first_new = next(when for when, epoch, _ in received if epoch == 2)
    assert first_new - standby_rounds[0] < 5.0
