"""The drafter role through its handler and the verifier's: assignments from the router only,
learning the committed prefix, leases on q rows, resynchronizing, stopping on switch, one
outstanding proposal, retries after a lost message, measured status."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from sdcp_fast.cache import object_uri
from sdcp_fast.cache.uri import writer_tag
from sdcp_fast.protocol import Action, Proposal, Resume, SdcpProblem
from sdcp_fast.protocol.messages import RULE_SPECULATIVE
from sdcp_fast.roles.objects import pack_tokens
from sdcp_fast.roles.router import RouterRole
from sdcp_fast.transport.base import Response
from sdcp_fast.transport.errors import TransportError

from .rolekit import (
    DRAFTER,
    OTHER,
    PROMPT,
    ROUTER,
    ROUTER_PEER,
    SCOPE,
    VERIFIER,
    Clock,
    Rig,
    assignment,
    contract,
    greedy,
    proposal,
    run,
    sid,
    until,
)

S = sid(11)
TOKENS = object_uri(SCOPE, S, "committed_tokens", 1, tag=writer_tag(VERIFIER))  # one object per epoch, its verifier's


async def assign(rig: Rig, opened, state, **kw):
    """The router's two steps (§6.1): PUT the verifier, then POST the drafter."""
    a = assignment(opened, state, **kw)
    confirmed = await rig.router.put_drafter(VERIFIER, a)
    await rig.router.assign(a.drafter, replace(a, round=confirmed.round, committed=confirmed.committed,
                                               digest=confirmed.digest))
    return a


def finished(rig: Rig, session: bytes = S):
    return lambda: rig.verifier.sessions.get(session).closed


def test_assignments_come_only_from_a_router_peer(tmp_path):
    """Peer identity: POST assignments is the router's (403 sdcp-forbidden for a drafter or a
    verifier certificate); an assignment naming another drafter is refused (400)."""

    async def scenario():
        async with Rig(str(tmp_path)) as rig:
            role = await rig.drafter_role()
            opened, state = await rig.open(S, drafter=None)
            a = assignment(opened, state)
            answers = []
            for client in (rig.other, rig.drafter, rig.client(rig.verifier.client.transport.peer)):
                with pytest.raises(SdcpProblem) as exc:
                    await client.assign(DRAFTER, a)
                answers.append((exc.value.suffix, exc.value.status))
            with pytest.raises(SdcpProblem) as exc:
                await rig.router.assign(DRAFTER, replace(a, drafter=OTHER))
            answers.append((exc.value.suffix, exc.value.status))
            idle = dict(role._sessions)
            await assign(rig, opened, state)
            await until(finished(rig))
            return answers, idle, rig.output_of(S), rig.target

    answers, idle, output, target = run(scenario())
    assert answers[:3] == [("sdcp-forbidden", 403)] * 3
    assert answers[3][1] == 400
    assert idle == {}
    assert output == greedy(target, PROMPT, 32)  # rule 1: whatever the drafter proposes (§6.4)


def test_joining_mid_session_learns_the_prefix_from_committed_tokens(tmp_path):
    """§6.1/§6.9: a drafter assigned mid-session starts from the committed prefix in the
    assignment; it reads the tokens from the committed_tokens object, checked against the
    assignment's digest (§4.2), and refuses an object that does not match it."""

    async def scenario():
        async with Rig(str(tmp_path)) as rig:
            role = await rig.drafter_role()
            opened, state = await rig.open(S, contract(max_new=24), drafter=OTHER)
            verdict = state
            for _ in range(2):  # another drafter commits two rounds first
                verdict = await rig.other.propose(VERIFIER, proposal(verdict, rig.greedy_after(verdict, 3),
                                                                     drafter=OTHER))
            committed = rig.output_of(S)
            # A committed_tokens object that does not hold the digest's prefix is refused.
            bad_ref = object_uri(SCOPE, sid(12), "committed_tokens")
            rig.mlc.put(bad_ref, pack_tokens([1] * len(committed)))
            a = assignment(opened, verdict, committed_tokens=bad_ref)
            await rig.router.put_drafter(VERIFIER, a)
            await rig.router.assign(DRAFTER, a)  # accepted; the prefix is learned in the session's task
            await until(lambda: S not in role._sessions)  # it gave up after a few tries: never proposed
            assert len(rig.scorer.scored) == 2
            await assign(rig, opened, verdict, committed_tokens=TOKENS)
            await until(finished(rig))
            return committed, role, rig.output_of(S), rig.target

    committed, role, output, target = run(scenario())
    assert len(committed) == 8
    assert output == greedy(target, PROMPT, 24)
    assert role.problems.get(S, []) == []  # every proposal extended the learned prefix


def test_q_rows_are_leased_until_the_verdict_and_released_after(tmp_path):
    """§6.2: the drafter holds leases on its draft artifacts until the verdict of the round;
    it releases them after (§6.3), and the spent rows go with the lease (nobody reads a
    round's rows after its verdict; kept, they would fill the MLC)."""

    async def scenario():
        async with Rig(str(tmp_path)) as rig:
            leases_while_scoring = []
            rig.scorer.on_score = lambda batch: leases_while_scoring.append(rig.mlc.stats()["leases"])
            await rig.drafter_role(fixed_m=3)
            opened, state = await rig.open(S, contract(RULE_SPECULATIVE, max_new=12), drafter=None)
            await assign(rig, opened, state)
            await until(finished(rig))
            await until(lambda: rig.mlc.stats()["leases"] == 0, seconds=2.0)
            left = [r for r in range(1, len(rig.rounds) + 1)
                    if rig.mlc.contains(object_uri(SCOPE, S, "q_rows", r, tag=writer_tag(DRAFTER)))]
            return leases_while_scoring, rig.mlc.stats()["leases"], rig.rounds, left

    during, after, rounds, left = run(scenario())
    assert during and all(n == 1 for n in during)
    assert after == 0
    assert len(rounds) == len(during)
    assert left == []


def test_a_stale_base_resynchronizes_the_drafter(tmp_path):
    """§6.3 Base check: a proposal on an outdated base is answered sdcp-stale-base with the
    session-state; the drafter adopts it, learns the tokens, and proposes on the right base.
    Here the session was resumed at epoch 2 (§6.9) and the assignment still names round 0."""

    async def scenario():
        async with Rig(str(tmp_path)) as rig:
            role = await rig.drafter_role()
            opened, state = await rig.open(S, contract(max_new=20), drafter=OTHER)
            verdict = await rig.other.propose(VERIFIER, proposal(state, rig.greedy_after(state, 3), drafter=OTHER))
            resumed = replace(opened, epoch=2, resume=Resume(round=1, committed=verdict.committed,
                                                              digest=verdict.digest, committed_tokens=TOKENS))
            await rig.router.open_session(VERIFIER, resumed)
            a = assignment(resumed, replace(state, epoch=2), committed_tokens=TOKENS)  # round 0: outdated
            await rig.router.put_drafter(VERIFIER, a)
            await rig.router.assign(DRAFTER, a)
            await until(finished(rig))
            return verdict, role.problems.get(S), rig.output_of(S), rig.target

    verdict, problems, output, target = run(scenario())
    assert verdict.committed == 4
    assert problems == ["sdcp-stale-base"]
    assert output == greedy(target, PROMPT, 20)


def test_the_drafter_stops_proposing_on_a_switch_verdict(tmp_path):
    """§6.5.2 switch: "the current drafter MUST stop proposing for the session"."""
    from sdcp_fast.model.toy import ToyDrafter

    async def scenario():
        async with Rig(str(tmp_path)) as rig:
            role = await rig.drafter_role(ToyDrafter("weak", rig.target, 6.0, seed=3), fixed_m=4)
            c = contract(low_rounds=1, low_ratio=100, fallback=(int(Action.SWITCH),), max_new=40)
            opened, state = await rig.open(S, c, drafter=None)
            await assign(rig, opened, state)
            await until(lambda: S not in role._sessions)
            scored = len(rig.scorer.scored)
            for _ in range(20):  # it had every chance to propose again
                await asyncio.sleep(0)
            return rig.rounds, scored, len(rig.scorer.scored), rig.verifier.sessions.get(S)

    rounds, scored_then, scored_now, session = run(scenario())
    assert rounds[-1].action == Action.SWITCH
    assert scored_then == scored_now == len(rounds)
    assert session.revoked and not session.closed


class Recording:
    """The drafter's transport, recording proposals in flight per session; ``lose`` names what
    the first proposal suffers: "request" (never delivered) or "answer" (delivered, answer lost)."""

    def __init__(self, inner, lose: str | None = None):
        self.inner = inner
        self.peer = inner.peer
        self.lose = lose
        self.in_flight: dict[bytes, int] = {}
        self.most = 0
        self.sent: list[bytes] = []

    async def request(self, base_uri, method, path, *, body=b"", **kw) -> Response:
        if path != "proposals":
            return await self.inner.request(base_uri, method, path, body=body, **kw)
        session = Proposal.decode(body).session
        self.in_flight[session] = self.in_flight.get(session, 0) + 1
        self.most = max(self.most, self.in_flight[session])
        self.sent.append(body)
        try:
            if self.lose == "request":
                self.lose = None
                raise ConnectionError("connection reset before the request was sent")
            if self.lose == "refused":  # the HTTP/2 transport's own error for the same
                self.lose = None
                raise TransportError("cannot connect to the verifier")
            response = await self.inner.request(base_uri, method, path, body=body, **kw)
            if self.lose == "answer":
                self.lose = None
                raise ConnectionError("connection reset before the answer arrived")
            return response
        finally:
            self.in_flight[session] -= 1

    async def close(self):
        await self.inner.close()


@pytest.mark.parametrize("lose", ["request", "answer", "refused"])
def test_a_lost_message_is_retried_with_the_same_proposal(tmp_path, lose):
    """§6.9 Lost messages: the drafter sends the same proposal again; proposals are idempotent
    per round, so a lost answer is answered from the recorded verdict, scored once."""

    async def scenario():
        async with Rig(str(tmp_path)) as rig:
            transport = Recording(rig.network.transport(rig.drafter.transport.peer), lose=lose)
            role = await rig.drafter_role(transport=transport)
            opened, state = await rig.open(S, contract(max_new=16), drafter=None)
            await assign(rig, opened, state)
            await until(finished(rig))
            return transport.sent, rig.scorer.scored, role.problems.get(S), rig.output_of(S), rig.target

    sent, scored, problems, output, target = run(scenario())
    first, again = Proposal.decode(sent[0]), Proposal.decode(sent[1])
    assert replace(first, status=again.status) == again  # the same request (§6.9)
    assert len(scored) == len(sent) - 1  # the retry was scored only if the first never arrived
    assert [p for _, p in scored][0] == first.tokens
    assert problems is None
    assert output == greedy(target, PROMPT, 16)


def test_one_outstanding_proposal_per_session(tmp_path):
    """§6.2: a drafter MUST NOT have more than one outstanding proposal per session, while its
    sessions are drafted side by side."""

    async def scenario():
        async with Rig(str(tmp_path)) as rig:
            transport = Recording(rig.network.transport(rig.drafter.transport.peer))
            await rig.drafter_role(transport=transport)
            for n in (21, 22, 23):
                opened, state = await rig.open(sid(n), contract(max_new=16), drafter=None)
                await assign(rig, opened, state)
            for n in (21, 22, 23):
                await until(finished(rig, sid(n)))
            batches = {info.batch for info in rig.rounds}
            return transport.most, batches, len(transport.sent)

    most, batches, sent = run(scenario())
    assert most == 1
    assert max(batches) > 1  # the sessions' proposals did overlap, in one scoring pass
    assert sent >= 3 * 3


def test_status_reports_measured_load_and_queue(tmp_path):
    """§5.2 status: the drafter reports the share of recent time it spent drafting and the
    sessions waiting for it, measured, to the router (PUT instances/{id}/status)."""

    class Slow:
        """Drafting takes 0.5 s of the fake clock per call."""

        def __init__(self, inner, clock):
            self.inner, self.clock, self.name = inner, clock, inner.name

        def propose(self, *args, **kw):
            self.clock.advance(0.5)
            return self.inner.propose(*args, **kw)

        def release(self, session):
            self.inner.release(session)

    async def scenario():
        from sdcp_fast.model.toy import ToyDrafter

        clock = Clock()
        async with Rig(str(tmp_path)) as rig:
            router = RouterRole(uri=ROUTER, mlc=rig.store, transport=rig.network.transport(ROUTER_PEER),
                                target_digest=b"\0" * 32, tokenizer_digest=b"\0" * 32, drafter_models={},
                                clock=clock)
            rig.network.register(ROUTER, router.handler)
            role = await rig.drafter_role(Slow(ToyDrafter("good", rig.target, 0.8), clock), router=ROUTER,
                                          clock=clock)
            idle = role.status()
            opened, state = await rig.open(S, contract(max_new=16), drafter=None)
            await assign(rig, opened, state)
            await until(finished(rig))
            busy = role.status()
            await role.report_status()
            reported = router.table.status(DRAFTER, clock())
            clock.advance(30.0)
            rested = role.status()
            return idle, busy, reported, rested

    idle, busy, reported, rested = run(scenario())
    assert idle.load == 0 and idle.queue == 0
    assert busy.load >= 50  # nearly all of the fake time went into drafting
    assert reported == busy
    assert rested.load < busy.load / 10


def test_verdict_for_a_finished_session_ends_the_drafters_part(tmp_path):
    """§6.5.2 finish: after the finishing verdict the drafter proposes nothing more and lets go
    of the session."""

    async def scenario():
        async with Rig(str(tmp_path)) as rig:
            role = await rig.drafter_role()
            opened, state = await rig.open(S, contract(max_new=5), drafter=None)
            await assign(rig, opened, state)
            await until(finished(rig))
            await until(lambda: S not in role._sessions)
            return rig.rounds, rig.scorer.scored

    rounds, scored = run(scenario())
    assert rounds[-1].action == Action.FINISH and len(scored) == len(rounds)


class FlakyPuts:
    """The store, unreachable for the first ``n`` puts (as while it restarts)."""

    def __init__(self, store, n):
        self.store, self.n, self.refused, self.names = store, n, 0, []

    async def put(self, uri, data, lease_ttl=None):
        if self.refused < self.n:
            self.refused += 1
            raise ConnectionError("the MLC is restarting")
        self.names.append(uri)
        return await self.store.put(uri, data, lease_ttl)

    def __getattr__(self, name):
        return getattr(self.store, name)


def test_q_rows_ride_out_an_unreachable_mlc_under_names_of_their_own(tmp_path):
    """A q-row put that finds the MLC unreachable is tried again (tests/faults, the MLC
    restart), and the rows are named with the drafter's tag, so a drafter taking a session over
    is never refused the round a dead predecessor stored (the object's writer owns it)."""

    async def scenario():
        async with Rig(str(tmp_path)) as rig:
            store = FlakyPuts(rig.store, 3)
            role = await rig.drafter_role(fixed_m=3)
            role.objects.store = store
            other = await rig.drafter_role(uri=OTHER)
            opened, state = await rig.open(S, contract(RULE_SPECULATIVE, max_new=9), drafter=None)
            await assign(rig, opened, state)
            await until(finished(rig))
            return store, role, other, rig.output_of(S)

    store, role, other, output = run(scenario())
    assert store.refused == 3 and role.metrics.store_retries._value.get() == 3
    assert len(output) == 9 and store.names
    assert all(n.split("/")[-1].endswith("." + role.q_rows.tag) for n in store.names)
    assert role.q_rows.tag != other.q_rows.tag
