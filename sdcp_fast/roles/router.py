"""The router role (§6.1, §6.5.2, §6.6, §6.9): status table, session creation, assignment,
events, policy updates, fail-over, and the front end's view of a session's output.

Resources (Table 1): ``PUT instances/{id}/status``, ``POST events``. Sessions are opened
through :meth:`RouterRole.open` (the front end's call): pick a verifier, ``POST sessions``
(epoch 1, commit log in the MLC), then a drafter, informing the verifier before the drafter.
A periodic sweep reassigns sessions whose drafter's status expired and fails over sessions
whose verifier's status expired: fence, read the last record, open elsewhere with
``resume``, re-send the sampling policy, re-assign. Its watchdog looks at every session that
committed nothing for a few ttl_ms: it moved on, the verifier decodes it, or it gets a drafter
again (protocol/routing.py; docs/reliability.md, "Drafter death"). Assignment delivery, the
sweep, the watchdog and fail-over are the router's :class:`Recovery` (roles/router_recovery.py).
Each session is one :class:`RoutedSession`, whose encoding is its routing record in the MLC.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from sdcp_fast.cache import object_uri
from sdcp_fast.cache.uri import writer_tag
from sdcp_fast.protocol import (
    Action,
    BadRequest,
    Contract,
    Event,
    Output,
    Sampling,
    SdcpProblem,
    SessionOpen,
    Status,
)
from sdcp_fast.protocol.commitlog import FenceRecord
from sdcp_fast.protocol.messages import ROLE_DRAFTER, ROLE_VERIFIER, RULE_GREEDY, parse_instance_path_id
from sdcp_fast.protocol.peer import PeerRole, require_role, same_instance
from sdcp_fast.protocol.problems import Busy, Forbidden
from sdcp_fast.protocol.routing import (
    RoutedSession,
    after_open,
    new_session_id,
    note_progress,
    on_event,
    policy_update,
)
from sdcp_fast.protocol.routing_records import adoption
from sdcp_fast.protocol.status_table import StatusTable, choose_verifier
from sdcp_fast.roles.metrics import RouterMetrics
from sdcp_fast.roles.objects import Objects
from sdcp_fast.roles.router_records import RecordObjects, RecordStore
from sdcp_fast.roles.router_recovery import Recovery
from sdcp_fast.roles.wire import Routes, SdcpClient, decode_body
from sdcp_fast.store.interface import Store
from sdcp_fast.transport.base import Request, Response, Transport


class PeerSource(Protocol):
    """Where a router in a cluster learns its verifiers and drafters (sdcp_fast/cluster/discovery.py
    reads them from etcd): it keeps the status table to the registered instances while it runs."""

    async def run(self, table: StatusTable, clock: Callable[[], float]) -> None: ...

    def admits(self, instance: str) -> bool: ...

log = logging.getLogger("sdcp_fast.router")



@dataclass(frozen=True)
class SessionSpec:
    """What a front end asks for; the router turns it into a contract (§4.1)."""

    prompt: Sequence[int]
    max_new: int = 64
    rule: int = RULE_GREEDY
    sampling: Sampling | None = None
    m_max: int = 8
    m_init: int = 4
    stop: tuple[int, ...] = ()
    low_rounds: int = 2
    low_ratio: int | None = 25
    fallback: tuple[int, ...] = (Action.REDUCE, Action.SWITCH, Action.SELF_DECODE, Action.FAIL)
    self_load: int | None = 50
    self_max: int | None = 8
    drafters: tuple[bytes, ...] | None = None  # permitted draft models (None: any)
    session: bytes | None = None  # None: 128 random bits; fix it to reproduce a seeded run (§6.4)


def serving_spec(prompt: Sequence[int] = (), **kw: Any) -> SessionSpec:
    """The contract sdcp_fast asks for on a user's behalf (the front end, ``generate``, the demo,
    the bench): a drafter that keeps being rejected is reduced, switched, then replaced by the
    target's own decoding, at any load (``self_load`` 100) and for the rest of the session. No
    request is failed for its drafts; the target decodes it, as a server without speculation
    would. ``SessionSpec``'s own defaults keep the draft's full ladder, ending in ``fail``."""
    kw.setdefault("fallback", (Action.REDUCE, Action.SWITCH, Action.SELF_DECODE))
    kw.setdefault("self_load", 100)
    kw.setdefault("self_max", None)
    return SessionSpec(prompt=tuple(prompt), **kw)


class RouterRole:
    def __init__(
        self,
        *,
        uri: str,
        mlc: Store,
        transport: Transport,
        target_digest: bytes,
        tokenizer_digest: bytes,
        drafter_models: Mapping[str, bytes],
        scope: bytes | None = None,
        sweep_interval: float = 0.5,
        stall_ttls: float = 3.0,
        clock: Callable[[], float] = time.monotonic,
        table: StatusTable | None = None,
        discovery: PeerSource | None = None,
        records: RecordObjects | None = None,
        commit_logs: Callable[[bytes, bytes], str] | None = None,
        durable: Callable[[], Awaitable[str | None]] | None = None,
    ) -> None:
        """``table``: the status table, when one is shared with another router (tests that
        restart one); None: its own. Its :class:`Recovery` works on the same one.
        In a cluster (sdcp_fast/cluster): ``discovery`` keeps the table to the instances the
        membership registry holds; ``records`` stores the routing records (None: the MLC);
        ``commit_logs(scope, session)`` names a session's commit log (None: the MLC's);
        ``durable()`` says why a new session's commit log and record cannot be written now (None:
        they can), and such a session is refused at once (503 ``sdcp-busy``) instead of waiting
        on its first append."""
        self.uri = uri
        self.mlc = mlc
        self.client = SdcpClient(transport)
        self.objects = Objects(mlc)
        self.target_digest = target_digest
        self.tokenizer_digest = tokenizer_digest
        self.scope = scope if scope is not None else os.urandom(16)
        self.sweep_interval = sweep_interval
        self.stall_ttls = stall_ttls  # the watchdog's period, in the session's drafter's ttl_ms
        self.clock = clock
        self.table = table if table is not None else StatusTable()
        for instance, model in drafter_models.items():
            self.table.register_model(instance, model)
        self.sessions: dict[bytes, RoutedSession] = {}  # each also its routing record
        self.changed: dict[bytes, asyncio.Event] = {}  # set when a session moved: wakes its output reader
        self._tasks: list[asyncio.Task[None]] = []
        self.discovery, self.commit_logs, self.durable = discovery, commit_logs, durable
        self.records = RecordStore(records if records is not None else mlc, self.scope, uri)
        self.routes = Routes()
        self.metrics = RouterMetrics.mount(self.routes)
        self.recovery = Recovery(
            uri=uri, client=self.client, mlc=mlc, objects=self.objects, records=self.records, metrics=self.metrics,
            table=self.table, sessions=self.sessions, changed=self.changed, scope=self.scope,
            sweep_interval=sweep_interval, stall_ttls=stall_ttls, clock=clock)
        self.routes.add("PUT", r"instances/(?P<iid>[^/]+)/status", self._put_status)
        self.routes.add("POST", r"events", self._post_event)
        self.routes.add("GET", r"instances", self._get_instances)  # operators: who is live now

    @property
    def handler(self) -> Routes:
        return self.routes

    async def start(self) -> None:
        self._tasks.append(asyncio.create_task(self.recovery.run(), name="router-sweep"))
        self._tasks.append(asyncio.create_task(self.adopt_listed(), name="router-adopt"))
        if self.discovery is not None:
            self._tasks.append(asyncio.create_task(self.discovery.run(self.table, self.clock), name="router-discovery"))

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()

    async def sweep(self) -> None:
        """One sweep now (:meth:`Recovery.sweep`), as the periodic one does."""
        await self.recovery.sweep()

    # -- resources ------------------------------------------------------------------------

    async def _put_status(self, request: Request, iid: str) -> None:
        require_role(request.peer, PeerRole.DRAFTER, PeerRole.VERIFIER)
        status = decode_body(Status, request)
        if parse_instance_path_id(iid) != status.instance:
            raise BadRequest("the path names another instance than the status")
        peer = request.peer
        assert peer is not None
        # An instance reports for itself only, in the role its certificate gives it.
        if peer.uri is None or not same_instance(peer.uri, status.instance):
            raise Forbidden(f"{peer.uri} may not report status for {status.instance}")
        expected = ROLE_DRAFTER if peer.role is PeerRole.DRAFTER else ROLE_VERIFIER
        if status.role != expected:
            raise Forbidden("status role does not match the certificate's role")
        if self.discovery is not None and not self.discovery.admits(status.instance):
            return None  # not registered (yet, or no longer): no candidate of this router's
        self.table.report(status, self.clock())
        return None

    async def _get_instances(self, request: Request) -> Response:
        """The live instances and their latest status, as JSON (not an SDCP resource)."""
        now = self.clock()
        live = [*self.table.live_verifiers(now), *self.table.live_drafters(now)]
        body = [{"instance": s.instance, "role": "drafter" if s.role == ROLE_DRAFTER else "verifier",
                 "load": s.load, "queue": s.queue, "accept_milli": s.accept_milli, "ttl_ms": s.ttl_ms} for s in live]
        return Response(200, json.dumps(body).encode(), {"content-type": "application/json"})

    async def _post_event(self, request: Request) -> None:
        require_role(request.peer, PeerRole.VERIFIER)
        event = decode_body(Event, request)
        routed = self.sessions.get(event.session)
        if routed is None:
            return None  # not ours (or long gone): nothing to do
        peer = request.peer
        assert peer is not None
        if peer.uri is None or not same_instance(peer.uri, routed.verifier):
            raise Forbidden(f"{peer.uri} is not the verifier of this session")
        if not await self.recovery.still_ours(routed):  # events are rare: one read of the record each
            return None
        async with self.recovery.lock:
            if event.epoch == routed.epoch:
                note_progress(routed, event.committed, self.clock())
            assignment = on_event(routed, event, self.table, self.clock())
            if assignment is not None:
                await self.recovery.assign(routed, assignment)
            elif routed.done:
                await self.recovery.persist(routed)
        self.recovery.moved(routed.session)
        return None

    # -- the front end's calls ------------------------------------------------------------

    def contract(self, spec: SessionSpec) -> Contract:
        return Contract(
            target=self.target_digest, tokenizer=self.tokenizer_digest, rule=spec.rule, m_max=spec.m_max,
            max_new=spec.max_new, stop=tuple(spec.stop), low_rounds=spec.low_rounds,
            fallback=tuple(int(a) for a in spec.fallback), drafters=spec.drafters, sampling=spec.sampling,
            low_ratio=spec.low_ratio, self_load=spec.self_load, self_max=spec.self_max, scope=self.scope,
        )

    async def open(self, spec: SessionSpec, request: dict[str, Any] | None = None) -> RoutedSession:
        """Create a session (§6.1): POST sessions at a live verifier, then assign a drafter.
        Its routing record (with the client's ``request``) is in the MLC before this returns."""
        if self.durable is not None and (why := await self.durable()) is not None:
            raise Busy(f"no new session now: {why}; retry later")
        session = spec.session if spec.session is not None else new_session_id(os.urandom(16))
        contract = self.contract(spec)
        unreachable: list[str] = []
        commit_log = self.commit_logs(self.scope, session) if self.commit_logs else object_uri(
            self.scope, session, "commit_log")
        epoch = 1
        while True:
            verifier = choose_verifier(self.table, self.clock(), exclude=tuple(unreachable))
            if verifier is None:
                raise Busy("no live verifier: none has reported its status within its ttl_ms"
                           + (f"; unreachable: {', '.join(unreachable)}" if unreachable else ""))
            routed = RoutedSession(
                opened=SessionOpen(session=session, epoch=epoch, contract=contract, prompt=tuple(spec.prompt),
                                   commit_log=commit_log),
                epoch=epoch, verifier=verifier, m_init=spec.m_init, router=self.uri, writers={epoch: verifier},
                committed_tokens=object_uri(self.scope, session, "committed_tokens", epoch, tag=writer_tag(verifier)),
                request=request,
            )
            try:
                # Bounded: a verifier stopped (SIGSTOP) since its last status report would hold the
                # client's request until it is continued, and it has no session to fail over yet.
                state = await asyncio.wait_for(self.client.open_session(verifier, routed.opened),
                                               3 * self.recovery.call_bound)
                break
            except (ConnectionError, TimeoutError, OSError) as exc:
                # Died or stopped since its last status report: its status has not expired yet, but
                # another verifier can take the session, at the next epoch behind a fence, since one
                # that did not answer may still have taken the open.
                log.warning("session %s: verifier %s unreachable at open: %s", session.hex(), verifier, exc)
                unreachable.append(verifier)
                epoch += 1
                await (await self.mlc.commit_log(commit_log)).append(FenceRecord(epoch=epoch), None)
        self.sessions[session], self.changed[session] = routed, asyncio.Event()
        note_progress(routed, state.committed, self.clock())
        self.metrics.sessions.inc()
        async with self.recovery.lock:
            assignment = after_open(routed, state, self.table, self.clock())
            if assignment is not None:
                await self.recovery.assign(routed, assignment)
            else:
                await self.recovery.persist(routed)
        return routed

    # -- adoption (docs/interpretations.md, "Routing records") ----------------------------

    async def adopt(self, session: bytes, *, claim: bool = True) -> RoutedSession | None:
        """Take over ``session`` from its routing record: at a restart (``claim`` False: only
        if the record still names this router) or for a client resuming its stream here
        (``claim``: whichever router routed it). None when there is no live session to take.
        The verifier is sent the session-open it holds again (idempotent, §6.1) and its
        answer says where the session stands."""
        routed = self.sessions.get(session)
        if routed is not None:
            return routed
        routed = await self.records.read(session)
        if routed is None:
            return None
        why = adoption(routed, self.uri, claim=claim)
        if why is not None:
            log.info("session %s: not adopted: %s", session.hex(), why)
            await self.records.forget({session})
            return None
        held = self.sessions.get(session)  # adopted meanwhile by a concurrent call
        if held is not None:
            return held
        was, routed.router = routed.router, self.uri
        self.sessions[session], self.changed[session] = routed, asyncio.Event()
        note_progress(routed, routed.committed, self.clock())
        log.info("session %s: adopted at epoch %d (verifier %s, drafter %s; was routed by %s)", session.hex(),
                 routed.epoch, routed.verifier, routed.drafter, was)
        await self.recovery.persist(routed)
        if routed.done:
            return routed  # ended: adopted for its output only, which its verifier may still serve
        try:
            state = await self.client.open_session(routed.verifier, routed.opened)
        except (ConnectionError, TimeoutError, OSError, SdcpProblem) as exc:
            # Its verifier is away: the output reader and the sweep fail the session over.
            log.warning("session %s: verifier %s did not say where it stands: %s", session.hex(), routed.verifier, exc)
            return routed
        routed.follow(state)
        note_progress(routed, state.committed, self.clock())
        return routed

    async def adopt_listed(self) -> None:
        """At start: adopt the live sessions this router's index names."""
        for session in await self.records.listed():
            try:
                await self.adopt(session, claim=False)
            except Exception:
                log.exception("session %s: adoption failed", session.hex())

    async def policy(self, session: bytes, from_round: int, sampling: Sampling) -> None:
        """A sampling update from ``from_round`` on (§6.6)."""
        routed = self.sessions[session]
        before = routed.sampling, list(routed.policies)
        try:
            await self.client.policy(routed.verifier, policy_update(routed, from_round, sampling))
        except SdcpProblem as problem:
            if problem.status < 500:  # refused, so never in effect: later assignments and a fail-over must not carry it
                routed.sampling, routed.policies = before
            raise
        await self.recovery.persist(routed)

    async def output(self, session: bytes, *, poll: float | None = None, start: int = 0) -> AsyncIterator[Output]:
        """The session's committed output as it grows, by index from ``start``, across
        fail-overs: output of an epoch lower than one already seen is discarded, so nothing
        repeats or goes missing (§6.7)."""
        routed, changed = self.sessions[session], self.changed[session]
        index, epoch = start, 0
        while True:
            verifier = routed.verifier
            try:
                out = await self._poll_output(routed, changed, verifier, index, poll)
                if out is None:
                    continue  # failed over meanwhile: poll the new verifier from the same index
            except (ConnectionError, TimeoutError, OSError, SdcpProblem) as exc:
                if isinstance(exc, SdcpProblem) and exc.suffix == "sdcp-unknown-session":
                    if routed.done:
                        raise  # ended (cancelled) and gone: nothing is left to read
                    await self.recovery.lost(routed, verifier)
                elif isinstance(exc, SdcpProblem) and exc.status < 500 and exc.suffix != "sdcp-stale-epoch":
                    raise
                # The verifier is gone or fenced: wait for the fail-over to name another.
                changed.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(changed.wait(), self.sweep_interval * 4)
                continue
            if out.epoch < epoch:
                continue
            epoch = out.epoch
            if out.final and not routed.done:  # before the last yield: its reader may stop there
                routed.done = True
                await self.recovery.persist(routed)
            if out.from_ == index and out.tokens:
                index += len(out.tokens)
                if out.epoch == routed.epoch:
                    note_progress(routed, index, self.clock())
                yield out
            if out.final:
                if not out.tokens:
                    yield out
                return

    async def _poll_output(self, routed: RoutedSession, changed: asyncio.Event, verifier: str, index: int,
                           poll: float | None) -> Output | None:
        """One output long-poll at ``verifier``, given up (None) once a fail-over opened the
        session elsewhere: a stopped or partitioned verifier answers nothing and resets nothing,
        and its poll would hold the stream until it came back."""
        opened = routed.opened
        call = asyncio.ensure_future(self.client.output(verifier, routed.session, index, timeout=poll))
        try:
            while True:
                woken = asyncio.ensure_future(changed.wait())
                try:
                    # The timeout only backs up the event: a fail-over sets it once the new verifier holds the session.
                    done, _ = await asyncio.wait((call, woken), timeout=self.sweep_interval * 4,
                                                 return_when=asyncio.FIRST_COMPLETED)
                finally:
                    woken.cancel()
                if call in done:
                    return call.result()
                if routed.opened is not opened:
                    return None
                if woken in done:
                    changed.clear()  # an event or a cancel: the poll answers those itself
        finally:
            call.cancel()  # given up, or its reader went away: the transport resets the request

    async def text(self, session: bytes) -> tuple[list[int], Action | None]:
        """Every output token of the session and how it ended."""
        tokens: list[int] = []
        finish = None
        async for out in self.output(session):
            tokens.extend(out.tokens)
            if out.final:
                finish = out.finish
        return tokens, finish

    async def cancel(self, session: bytes, why: str = "its client went away") -> None:
        """End a session nobody reads any more: ``DELETE sessions/{id}`` at its verifier (an
        extension, docs/interpretations.md "Cancelling a session"), which drops its rounds and
        frees its cache; the sweep no longer reassigns or fails it over."""
        routed = self.sessions.get(session)
        if routed is None or routed.done:
            return
        routed.done = True
        self.recovery.undelivered.pop(session, None)
        self.recovery.moved(session)
        await self.recovery.persist(routed)
        log.info("session %s: cancelled (%s) at verifier %s", session.hex(), why, routed.verifier)
        try:
            await self.client.cancel(routed.verifier, session)
        except (ConnectionError, TimeoutError, OSError, SdcpProblem) as exc:
            log.warning("session %s: cancel at verifier %s failed: %s", session.hex(), routed.verifier, exc)
