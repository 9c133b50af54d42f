"""The router role through its handler and a real verifier: status reports from the instance
itself, expiry, assignment order, idempotent events, events from the session's verifier only,
verifier fail-over with the front end's output stream, random session ids."""

from __future__ import annotations

import asyncio

import pytest

from sdcp_fast.cache import object_uri
from sdcp_fast.protocol import (
    Action,
    Event,
    Sampling,
    SdcpProblem,
    contract_digest,
    extend_digest,
    instance_path_id,
    prefix_digest,
)
from sdcp_fast.protocol.commitlog import CommitRecord, FenceRecord
from sdcp_fast.protocol.messages import ROLE_DRAFTER, ROLE_VERIFIER, RULE_SPECULATIVE
from sdcp_fast.protocol.peer import Peer, PeerRole
from sdcp_fast.roles.router import RouterRole, SessionSpec
from sdcp_fast.transport.base import Request, Response

from .rolekit import (
    DRAFTER,
    OTHER,
    PROMPT,
    ROUTER,
    ROUTER_PEER,
    SCOPE,
    TARGET,
    TOKENIZER,
    VERIFIER,
    VERIFIER_PEER,
    Clock,
    Failover,
    Rig,
    run,
    sid,
    status,
    until,
)

S = sid(31)


class StubDrafter:
    """A drafter instance that records the assignments it is sent (and drafts nothing)."""

    def __init__(self, uri: str, log: list[tuple[str, str, str]]):
        self.uri = uri
        self.log = log
        self.assignments = []

    async def handler(self, request: Request) -> Response:
        from sdcp_fast.protocol import Assignment

        self.assignments.append(Assignment.decode(request.body))
        return Response(204)


class Logged:
    """The router's transport, logging every request it sends in order."""

    def __init__(self, inner, log):
        self.inner, self.log, self.peer = inner, log, inner.peer

    async def request(self, base_uri, method, path, **kw):
        self.log.append((base_uri, method, path.split("/")[-1]))
        return await self.inner.request(base_uri, method, path, **kw)

    async def close(self):
        await self.inner.close()


class RouterRig(Rig):
    """A router (fake clock, no background sweeper) in front of the rig's verifier, with stub
    drafters at DRAFTER and OTHER."""

    def __init__(self, root: str, **kw):
        super().__init__(root, **kw)
        self.clock = Clock()
        self.sent: list[tuple[str, str, str]] = []
        self.router_role = RouterRole(
            uri=ROUTER, mlc=self.store, transport=Logged(self.network.transport(ROUTER_PEER), self.sent),
            target_digest=TARGET, tokenizer_digest=TOKENIZER, scope=SCOPE, clock=self.clock,
            drafter_models={DRAFTER: b"a" * 32, OTHER: b"b" * 32}, sweep_interval=0.01)
        self.network.register(ROUTER, self.router_role.handler)
        self.stubs = {uri: StubDrafter(uri, self.sent) for uri in (DRAFTER, OTHER)}
        for uri, stub in self.stubs.items():
            self.network.register(uri, stub.handler)

    async def report(self, client, instance, role, **kw):
        await client.status(ROUTER, status(instance, role, **kw))


def test_status_is_accepted_only_from_the_instance_itself_in_its_role(tmp_path):
    """§6.1 status reports; peer identity: an instance reports for itself, in the role its
    certificate gives it (403 sdcp-forbidden otherwise); {id} is the instance's path id."""

    async def scenario():
        async with RouterRig(str(tmp_path)) as rig:
            answers = {}
            cases = {
                "other instance": (rig.drafter, OTHER, ROLE_DRAFTER),
                "other role": (rig.drafter, DRAFTER, ROLE_VERIFIER),
                "router peer": (rig.router, ROUTER, ROLE_VERIFIER),
                "no role": (rig.client(Peer(DRAFTER, None)), DRAFTER, ROLE_DRAFTER),
            }
            for name, (client, instance, role) in cases.items():
                with pytest.raises(SdcpProblem) as exc:
                    await rig.report(client, instance, role)
                answers[name] = (exc.value.suffix, exc.value.status)
            # A path naming another instance than the body.
            t = rig.network.transport(Peer(DRAFTER, PeerRole.DRAFTER))
            wrong_path = await t.request(ROUTER, "PUT", f"instances/{instance_path_id(OTHER)}/status",
                                         body=status(DRAFTER).encode(),
                                         headers={"content-type": "application/sdcp+cbor"})
            await rig.report(rig.drafter, DRAFTER, ROLE_DRAFTER)
            await rig.report(rig.client(VERIFIER_PEER), VERIFIER, ROLE_VERIFIER)
            table = rig.router_role.table
            now = rig.clock()
            return answers, wrong_path.status, table.status(DRAFTER, now), table.status(VERIFIER, now), table, now

    answers, wrong_path, drafter, verifier, table, now = run(scenario())
    assert answers == {name: ("sdcp-forbidden", 403) for name in answers}
    assert wrong_path == 400
    assert drafter.instance == DRAFTER and verifier.instance == VERIFIER
    assert table.status(OTHER, now) is None


def test_no_assignment_to_an_expired_instance(tmp_path):
    """§6.1: the router MUST NOT assign sessions to an instance whose status has expired;
    §6.9: the sessions of a drafter whose status expired are reassigned."""

    async def scenario():
        async with RouterRig(str(tmp_path)) as rig:
            await rig.report(rig.client(VERIFIER_PEER), VERIFIER, ROLE_VERIFIER, ttl_ms=600_000)
            # DRAFTER is the better choice (load 0) but its status lives 1 s; OTHER's 60 s.
            await rig.report(rig.drafter, DRAFTER, ROLE_DRAFTER, load=0, ttl_ms=1000)
            await rig.report(rig.other, OTHER, ROLE_DRAFTER, load=90, ttl_ms=60_000)
            rig.clock.advance(2.0)
            first = await rig.router_role.open(SessionSpec(PROMPT, session=sid(32)))
            rig.clock.advance(60.0)  # OTHER expires too: nobody may be assigned
            second = await rig.router_role.open(SessionSpec(PROMPT, session=sid(33)))
            unassigned = second.drafter
            await rig.router_role.sweep()  # nobody is live: nothing is assigned
            assert not rig.stubs[DRAFTER].assignments and len(rig.stubs[OTHER].assignments) == 1
            await rig.report(rig.drafter, DRAFTER, ROLE_DRAFTER, ttl_ms=1000)
            await rig.router_role.sweep()  # first's drafter (OTHER) expired: reassigned to DRAFTER
            return (first.drafter, unassigned, rig.stubs[DRAFTER].assignments, rig.stubs[OTHER].assignments,
                    rig.verifier.sessions.get(sid(32)).drafter)

    first, unassigned, to_drafter, to_other, at_verifier = run(scenario())
    assert unassigned is None
    assert [a.session for a in to_other] == [sid(32)]
    assert sorted(a.session for a in to_drafter) == sorted([sid(32), sid(33)])
    assert first == DRAFTER == at_verifier


def test_a_session_opened_with_no_live_drafter_is_assigned_once_one_reports(tmp_path):
    """§6.1: the router selects a drafter for every session; one opened while none was live
    gets the first that reports (at the next sweep), informing the verifier first."""

    async def scenario():
        async with RouterRig(str(tmp_path)) as rig:
            await rig.report(rig.client(VERIFIER_PEER), VERIFIER, ROLE_VERIFIER)
            routed = await rig.router_role.open(SessionSpec(PROMPT, session=S))
            unassigned = routed.drafter
            await rig.router_role.sweep()
            await rig.report(rig.drafter, DRAFTER, ROLE_DRAFTER)
            await rig.router_role.sweep()
            await rig.router_role.sweep()  # assigned once
            return unassigned, routed.drafter, rig.stubs[DRAFTER].assignments, rig.sent

    unassigned, drafter, assignments, sent = run(scenario())
    assert unassigned is None and drafter == DRAFTER and len(assignments) == 1
    assert [p for _, _, p in sent][-2:] == ["drafter", "assignments"]


def test_the_verifier_is_informed_before_the_drafter(tmp_path):
    """§6.1: PUT sessions/{id}/drafter to the verifier first, then POST assignments, carrying
    the verifier's current round, committed length and digest."""

    async def scenario():
        async with RouterRig(str(tmp_path)) as rig:
            await rig.report(rig.client(VERIFIER_PEER), VERIFIER, ROLE_VERIFIER)
            await rig.report(rig.drafter, DRAFTER, ROLE_DRAFTER)
            routed = await rig.router_role.open(SessionSpec(PROMPT, session=S))
            return rig.sent, rig.stubs[DRAFTER].assignments, routed

    sent, assignments, routed = run(scenario())
    assert [(m, p) for _, m, p in sent] == [("POST", "sessions"), ("PUT", "drafter"), ("POST", "assignments")]
    assert sent[1][0] == VERIFIER and sent[2][0] == DRAFTER
    [a] = assignments
    d0 = prefix_digest(contract_digest(routed.contract), PROMPT)
    assert (a.round, a.committed, a.digest, a.verifier, a.drafter) == (0, 0, d0, VERIFIER, DRAFTER)


def test_events_are_idempotent_and_only_from_the_sessions_verifier(tmp_path):
    """§6.5.2 switch, delivered twice, reassigns once (idempotent events); POST events is the
    session's verifier's (403 sdcp-forbidden for a drafter or another verifier)."""

    async def scenario():
        async with RouterRig(str(tmp_path)) as rig:
            await rig.report(rig.client(VERIFIER_PEER), VERIFIER, ROLE_VERIFIER)
            await rig.report(rig.drafter, DRAFTER, ROLE_DRAFTER)
            await rig.report(rig.other, OTHER, ROLE_DRAFTER, load=10)
            routed = await rig.router_role.open(SessionSpec(PROMPT, session=S))
            d0 = prefix_digest(contract_digest(routed.contract), PROMPT)
            switch = Event(session=S, epoch=1, kind=Action.SWITCH, committed=0, digest=d0)
            refused = []
            for client in (rig.drafter, rig.client(Peer("inproc://verifier-2/", PeerRole.VERIFIER))):
                with pytest.raises(SdcpProblem) as exc:
                    await client.event(ROUTER, switch)
                refused.append((exc.value.suffix, exc.value.status))
            verifier = rig.client(VERIFIER_PEER)
            await verifier.event(ROUTER, switch)
            await verifier.event(ROUTER, switch)
            return refused, rig.stubs, rig.verifier.sessions.get(S).drafter

    refused, stubs, at_verifier = run(scenario())
    assert refused == [("sdcp-forbidden", 403)] * 2
    assert len(stubs[DRAFTER].assignments) == 1 and len(stubs[OTHER].assignments) == 1
    assert at_verifier == OTHER


def test_a_policy_the_verifier_refused_is_not_carried_on(tmp_path):
    """§6.6: the router includes a policy in later assignments (and a fail-over re-sends it);
    one the verifier refused (from_round not after the current round) was never in effect, so
    neither carries it; an accepted one is carried."""

    async def scenario():
        async with RouterRig(str(tmp_path)) as rig:
            await rig.report(rig.client(VERIFIER_PEER), VERIFIER, ROLE_VERIFIER)
            await rig.report(rig.drafter, DRAFTER, ROLE_DRAFTER)
            await rig.report(rig.other, OTHER, ROLE_DRAFTER, load=10)
            routed = await rig.router_role.open(SessionSpec(PROMPT, session=S))
            with pytest.raises(SdcpProblem) as refused:
                await rig.router_role.policy(S, 0, Sampling(top_k=3))
            kept = routed.sampling, list(routed.policies)
            d0 = prefix_digest(contract_digest(routed.contract), PROMPT)
            await rig.client(VERIFIER_PEER).event(
                ROUTER, Event(session=S, epoch=1, kind=Action.SWITCH, committed=0, digest=d0))
            await rig.router_role.policy(S, 2, Sampling(top_k=4))
            return refused.value, kept, rig.stubs[OTHER].assignments, routed.sampling

    refused, kept, to_other, sampling = run(scenario())
    assert (refused.suffix, refused.status) == ("sdcp-bad-request", 400)
    assert kept == (None, [])
    assert [a.sampling for a in to_other] == [None]
    assert sampling == Sampling(top_k=4)


def test_session_ids_are_random_when_the_spec_names_none(tmp_path):
    """Session ids (§5.2, 16 bytes) come from 128 random bits at the router."""

    async def scenario():
        async with RouterRig(str(tmp_path)) as rig:
            await rig.report(rig.client(VERIFIER_PEER), VERIFIER, ROLE_VERIFIER)
            return [(await rig.router_role.open(SessionSpec(PROMPT))).session for _ in range(3)]

    ids = run(scenario())
    assert len(set(ids)) == 3 and all(len(i) == 16 for i in ids)


# -- verifier fail-over (§6.9) --------------------------------------------------------------

ACTIVE = "inproc://verifier-a/"
STANDBY = "inproc://verifier-b/"


def test_verifier_failover_resumes_the_session_and_the_output_stream(tmp_path):
    """§6.9 Verifier failure: when the active verifier's status expires, the router fences the
    log with the next epoch, reads the last commit record, opens the session at the standby
    with resume and the current sampling policy (§6.6), and assigns the drafter again; the
    front end's output stream continues without duplicates or gaps (§6.7)."""
    parts = Failover(str(tmp_path))
    clock, mlc = parts.clock, parts.mlc
    policy = Sampling(temperature_milli=500, top_k=8, seed=77)
    killed_at, kill_after_round_3 = parts.partition_after(ACTIVE, 3)

    async def scenario():
        router = parts.router()
        active, standby = parts.verifier(ACTIVE, kill_after_round_3), parts.verifier(STANDBY)
        drafter = parts.drafter()
        roles = [active, drafter, standby]
        for role in roles[:2]:
            await role.start()  # each reports its status once now, then every ttl_ms / 3 (10 s)
        try:
            await until(lambda: router.table.status(DRAFTER, clock()) is not None)
            spec = SessionSpec(PROMPT, max_new=40, rule=RULE_SPECULATIVE, session=S,
                               sampling=Sampling(temperature_milli=1000, seed=76))
            routed = await router.open(spec)
            assert routed.verifier == ACTIVE
            await standby.start()  # the standby joins once the session is placed
            await router.policy(S, 3, policy)  # from round 3 on (§6.6)
            stream = asyncio.create_task(router.text(S))
            await until(lambda: killed_at)
            # The active verifier falls silent past its ttl_ms; the others keep reporting.
            clock.advance(11.0)
            await standby.report_status()
            await drafter.report_status()
            await router.sweep()
            tokens, finish = await asyncio.wait_for(stream, 15.0)
            at_standby = standby.sessions.get(S)
            return (routed, tokens, finish, at_standby, at_standby.output(0).tokens,
                    active.sessions.get(S).output(0).tokens, drafter.problems.get(S))
        finally:
            for role in roles:
                await role.close()

    try:
        routed, tokens, finish, at_standby, final, before, problems = run(scenario(), timeout=30.0)
        records = mlc.logs.log(object_uri(SCOPE, S, "commit_log")).read().records
    finally:
        mlc.close()
    assert routed.verifier == STANDBY and routed.epoch == 2
    assert at_standby.epoch == 2 and finish == Action.FINISH
    # No duplicates, no gaps: the stream is the committed output, whose prefix the old epoch
    # released, and the digest chain holds over all of it.
    assert tokens == list(final) and len(tokens) == 40
    assert list(before) == tokens[:len(before)] and before
    d0 = prefix_digest(contract_digest(routed.contract), PROMPT)
    assert extend_digest(d0, tokens) == at_standby.digest
    # The log: epoch 1's rounds, the fence, then epoch 2's rounds continuing the numbering.
    kinds = [(type(r).__name__, r.epoch) for r in records]
    fence = kinds.index(("FenceRecord", 2))
    assert all(k == ("CommitRecord", 1) for k in kinds[:fence])
    assert all(k == ("CommitRecord", 2) for k in kinds[fence + 1:])
    commits = [r for r in records if isinstance(r, CommitRecord)]
    assert [r.round for r in commits] == list(range(1, len(commits) + 1))
    assert isinstance(records[fence], FenceRecord)
    # The standby applies the current sampling policy to the rounds it verifies.
    assert at_standby.sampling_for(at_standby.round) == policy
    assert problems in (None, ["sdcp-stale-epoch"])


class Cutting(Logged):
    """Loses the connection of the first ``cuts[path]`` requests to each resource (before
    they arrive), as a cut TCP connection does (tests/faults, scenario 5)."""

    def __init__(self, inner, log, cuts):
        super().__init__(inner, log)
        self.cuts = dict(cuts)

    async def request(self, base_uri, method, path, **kw):
        last = path.split("/")[-1]
        if self.cuts.get(last, 0) > 0:
            self.cuts[last] -= 1
            self.log.append((base_uri, method, last + " (cut)"))
            raise ConnectionError("connection closed before the response")
        return await super().request(base_uri, method, path, **kw)


def _cut_router(rig: RouterRig, cuts) -> None:
    rig.router_role.client.transport = Cutting(rig.router_role.client.transport.inner, rig.sent, cuts)


def test_a_lost_connection_neither_fails_an_open_nor_an_assignment(tmp_path):
    """Found by the cut-connections scenario: POST sessions (idempotent), PUT drafter and POST
    assignments are sent again when their connection is lost before the answer."""

    async def scenario():
        async with RouterRig(str(tmp_path)) as rig:
            _cut_router(rig, {"sessions": 1, "drafter": 2, "assignments": 1})
            await rig.report(rig.client(VERIFIER_PEER), VERIFIER, ROLE_VERIFIER)
            await rig.report(rig.drafter, DRAFTER, ROLE_DRAFTER)
            routed = await rig.router_role.open(SessionSpec(PROMPT, session=S))
            return rig.sent, rig.stubs[DRAFTER].assignments, routed

    sent, assignments, routed = run(scenario())
    assert [p for _, _, p in sent] == ["sessions (cut)", "sessions", "drafter (cut)", "drafter (cut)", "drafter",
                                       "assignments (cut)", "assignments"]
    assert routed.drafter == DRAFTER and [a.session for a in assignments] == [S]


def test_an_assignment_the_drafter_never_got_is_delivered_by_the_sweep(tmp_path):
    """A drafter that never got its assignment never proposes while its status stays fresh, so
    no expiry would reassign the session: the sweep delivers it again until it arrives."""

    async def scenario():
        async with RouterRig(str(tmp_path)) as rig:
            _cut_router(rig, {"assignments": rig.router_role.client.attempts + 1})
            await rig.report(rig.client(VERIFIER_PEER), VERIFIER, ROLE_VERIFIER)
            await rig.report(rig.drafter, DRAFTER, ROLE_DRAFTER)
            await rig.router_role.open(SessionSpec(PROMPT, session=S))
            before = list(rig.stubs[DRAFTER].assignments)
            await rig.router_role.sweep()
            after = list(rig.stubs[DRAFTER].assignments)
            await rig.router_role.sweep()  # delivered: not again
            return before, after, rig.stubs[DRAFTER].assignments

    before, after, final = run(scenario())
    assert before == [] and [a.session for a in after] == [S] and len(final) == 1


def test_a_verifier_that_died_since_its_last_report_does_not_fail_an_open(tmp_path):
    """A verifier killed just before an open still looks live (its status
    has not expired); the open goes to another live verifier, and with none left the client
    gets the documented 503 (sdcp-busy), not a 500."""
    dead = "inproc://verifier-dead/"

    async def scenario():
        async with RouterRig(str(tmp_path)) as rig:
            await rig.report(rig.client(Peer(dead, PeerRole.VERIFIER)), dead, ROLE_VERIFIER, load=0)
            await rig.report(rig.client(VERIFIER_PEER), VERIFIER, ROLE_VERIFIER, load=90)
            await rig.report(rig.drafter, DRAFTER, ROLE_DRAFTER)
            routed = await rig.router_role.open(SessionSpec(PROMPT, session=S))
            _cut_router(rig, {"sessions": 100})
            with pytest.raises(SdcpProblem) as exc:
                await rig.router_role.open(SessionSpec(PROMPT, session=sid(34)))
            return routed, rig.sent, exc.value

    routed, sent, problem = run(scenario())
    assert routed.verifier == VERIFIER
    assert list(dict.fromkeys(b for b, _, p in sent if p.startswith("sessions"))) == [dead, VERIFIER]
    assert (problem.status, problem.suffix) == (503, "sdcp-busy")


def test_a_restarted_router_adopts_the_session_and_still_fails_it_over(tmp_path):
    """The router is replaced by a new process of itself (same URI and scope, nothing in
    memory) after the open and a sampling update: it adopts the session from its routing
    record (docs/interpretations.md, "Routing records"), and when the active verifier falls
    silent it fences, resumes the session at the standby with the recorded policy, and the
    output stream goes on to its end without duplicates or gaps."""
    parts = Failover(str(tmp_path))
    clock, mlc = parts.clock, parts.mlc
    policy = Sampling(temperature_milli=500, top_k=8, seed=77)
    killed_at, kill_after_round_3 = parts.partition_after(ACTIVE, 3)

    async def scenario():
        first = parts.router()
        active, standby = parts.verifier(ACTIVE, kill_after_round_3), parts.verifier(STANDBY)
        drafter = parts.drafter()
        roles = [active, drafter, standby]
        for role in roles[:2]:
            await role.start()
        try:
            await until(lambda: first.table.status(DRAFTER, clock()) is not None)
            spec = SessionSpec(PROMPT, max_new=40, rule=RULE_SPECULATIVE, session=S,
                               sampling=Sampling(temperature_milli=1000, seed=76))
            await first.open(spec)
            await standby.start()
            await first.policy(S, 3, policy)
            second = parts.router()  # the restart: the first one's memory is gone, its records are not
            for role in roles:
                await role.report_status()
            await second.adopt_listed()
            adopted = S in second.sessions
            stream = asyncio.create_task(second.text(S))
            await until(lambda: killed_at)
            clock.advance(11.0)
            await standby.report_status()
            await drafter.report_status()
            await second.sweep()
            tokens, finish = await asyncio.wait_for(stream, 15.0)
            at_standby = standby.sessions.get(S)
            return adopted, second.sessions[S], tokens, finish, at_standby, at_standby.output(0).tokens
        finally:
            for role in roles:
                await role.close()

    try:
        adopted, routed, tokens, finish, at_standby, final = run(scenario(), timeout=30.0)
    finally:
        mlc.close()
    assert adopted and routed.verifier == STANDBY and routed.epoch == 2 and finish == Action.FINISH
    assert tokens == list(final) and len(tokens) == 40
    assert at_standby.sampling_for(at_standby.round) == policy
