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
sweep, the watchdog and fail-over live in roles/router_recovery.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sdcp_fast.cache import object_uri
from sdcp_fast.cache.uri import writer_tag
from sdcp_fast.protocol import (
    Action,
    Assignment,
    BadRequest,
    Contract,
    Event,
    Output,
    Sampling,
    SdcpProblem,
    Status,
)
from sdcp_fast.protocol.messages import ROLE_DRAFTER, ROLE_VERIFIER, RULE_GREEDY, parse_instance_path_id
from sdcp_fast.protocol.peer import PeerRole, require_role, same_instance
from sdcp_fast.protocol.problems import Busy, Forbidden
from sdcp_fast.protocol.routing import (
    RoutedSession,
    after_open,
    new_session_id,
    note_progress,
    on_event,
    open_message,
    policy_update,
)
from sdcp_fast.protocol.routing_records import adoption, routed_from
from sdcp_fast.protocol.status_table import StatusTable, choose_verifier
from sdcp_fast.roles.metrics import RouterMetrics
from sdcp_fast.roles.objects import Objects
from sdcp_fast.roles.router_records import RecordStore
from sdcp_fast.roles.router_recovery import Recovery, _Routed
from sdcp_fast.roles.wire import Routes, SdcpClient, decode_body
from sdcp_fast.store.interface import Store
from sdcp_fast.transport.base import Request, Response, Transport

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


class RouterRole(Recovery):
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
    ) -> None:
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
        self.table = StatusTable()
        for instance, model in drafter_models.items():
            self.table.register_model(instance, model)
        self.sessions: dict[bytes, _Routed] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._lock = asyncio.Lock()  # one reassignment or fail-over at a time
        self._undelivered: dict[bytes, Assignment] = {}  # assignments whose drafter did not get them
        self.records = RecordStore(mlc, self.scope, uri)
        self.routes = Routes()
        self.metrics = RouterMetrics.mount(self.routes)
        self.routes.add("PUT", r"instances/(?P<iid>[^/]+)/status", self._put_status)
        self.routes.add("POST", r"events", self._post_event)
        self.routes.add("GET", r"instances", self._get_instances)  # operators: who is live now

    @property
    def handler(self) -> Routes:
        return self.routes

    async def start(self) -> None:
        self._tasks.append(asyncio.create_task(self._sweeper(), name="router-sweep"))
        self._tasks.append(asyncio.create_task(self.adopt_listed(), name="router-adopt"))

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()

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
        entry = self.sessions.get(event.session)
        if entry is None:
            return None  # not ours (or long gone): nothing to do
        peer = request.peer
        assert peer is not None
        if peer.uri is None or not same_instance(peer.uri, entry.routed.verifier):
            raise Forbidden(f"{peer.uri} is not the verifier of this session")
        if not await self._still_ours(entry.routed):  # events are rare: one read of the record each
            return None
        async with self._lock:
            if event.epoch == entry.routed.epoch:
                note_progress(entry.routed, event.committed, self.clock())
            assignment = on_event(entry.routed, event, self.table, self.clock())
            if assignment is not None:
                await self._assign(entry.routed, assignment)
            elif entry.routed.done:
                await self._persist(entry.routed)
        entry.changed.set()
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
        session = spec.session if spec.session is not None else new_session_id(os.urandom(16))
        contract = self.contract(spec)
        unreachable: list[str] = []
        while True:
            verifier = choose_verifier(self.table, self.clock(), exclude=tuple(unreachable))
            if verifier is None:
                raise Busy("no live verifier: none has reported its status within its ttl_ms"
                           + (f"; unreachable: {', '.join(unreachable)}" if unreachable else ""))
            routed = RoutedSession(
                session=session, epoch=1, contract=contract, prompt=tuple(spec.prompt),
                commit_log=object_uri(self.scope, session, "commit_log"), verifier=verifier, round=0,
                committed=0, digest=bytes(32), m_init=spec.m_init,
                committed_tokens=object_uri(self.scope, session, "committed_tokens", 1, tag=writer_tag(verifier)),
            )
            opened = open_message(routed)
            try:
                state = await self.client.open_session(verifier, opened)
                break
            except (ConnectionError, OSError) as exc:
                # Died since its last status report (a kill just before an
                # open): its status has not expired yet, but another verifier can take the session.
                log.warning("session %s: verifier %s unreachable at open: %s", session.hex(), verifier, exc)
                unreachable.append(verifier)
        self.sessions[session] = _Routed(routed, opened=opened, writers={1: verifier}, request=request)
        note_progress(routed, state.committed, self.clock())
        self.metrics.sessions.inc()
        async with self._lock:
            assignment = after_open(routed, state, self.table, self.clock())
            if assignment is not None:
                await self._assign(routed, assignment)
            else:
                await self._persist(routed)
        return routed

    # -- adoption (docs/interpretations.md, "Routing records") ----------------------------

    async def adopt(self, session: bytes, *, claim: bool = True) -> _Routed | None:
        """Take over ``session`` from its routing record: at a restart (``claim`` False: only
        if the record still names this router) or for a client resuming its stream here
        (``claim``: whichever router routed it). None when there is no live session to take.
        The verifier is sent the session-open it holds again (idempotent, §6.1) and its
        answer says where the session stands."""
        entry = self.sessions.get(session)
        if entry is not None:
            return entry
        record = await self.records.read(session)
        if record is None:
            return None
        why = adoption(record, self.uri, claim=claim)
        if why is not None:
            log.info("session %s: not adopted: %s", session.hex(), why)
            await self.records.forget({session})
            return None
        entry = self.sessions.get(session)  # adopted meanwhile by a concurrent call
        if entry is not None:
            return entry
        routed = routed_from(record)
        entry = _Routed(routed, opened=record.opened, writers=dict(record.writers), request=record.request)
        self.sessions[session] = entry
        note_progress(routed, routed.committed, self.clock())
        log.info("session %s: adopted at epoch %d (verifier %s, drafter %s; was routed by %s)", session.hex(),
                 routed.epoch, routed.verifier, routed.drafter, record.router)
        await self._persist(routed)
        if routed.done:
            return entry  # ended: adopted for its output only, which its verifier may still serve
        try:
            state = await self.client.open_session(routed.verifier, record.opened)
        except (ConnectionError, TimeoutError, OSError, SdcpProblem) as exc:
            # Its verifier is away: the output reader and the sweep fail the session over.
            log.warning("session %s: verifier %s did not say where it stands: %s", session.hex(), routed.verifier, exc)
            return entry
        routed.follow(state)
        note_progress(routed, state.committed, self.clock())
        return entry

    async def adopt_listed(self) -> None:
        """At start: adopt the live sessions this router's index names."""
        for session in await self.records.listed():
            try:
                await self.adopt(session, claim=False)
            except Exception:
                log.exception("session %s: adoption failed", session.hex())

    async def policy(self, session: bytes, from_round: int, sampling: Sampling) -> None:
        """A sampling update from ``from_round`` on (§6.6)."""
        routed = self.sessions[session].routed
        before = routed.sampling, list(routed.policies)
        try:
            await self.client.policy(routed.verifier, policy_update(routed, from_round, sampling))
        except SdcpProblem as problem:
            if problem.status < 500:  # refused, so never in effect: later assignments and a fail-over must not carry it
                routed.sampling, routed.policies = before
            raise
        await self._persist(routed)

    async def output(self, session: bytes, *, poll: float | None = None, start: int = 0) -> AsyncIterator[Output]:
        """The session's committed output as it grows, by index from ``start``, across
        fail-overs: output of an epoch lower than one already seen is discarded, so nothing
        repeats or goes missing (§6.7)."""
        entry = self.sessions[session]
        index, epoch = start, 0
        while True:
            routed = entry.routed
            verifier = routed.verifier
            try:
                out = await self._poll_output(entry, verifier, index, poll)
                if out is None:
                    continue  # failed over meanwhile: poll the new verifier from the same index
            except (ConnectionError, TimeoutError, OSError, SdcpProblem) as exc:
                if isinstance(exc, SdcpProblem) and exc.suffix == "sdcp-unknown-session":
                    if routed.done:
                        raise  # ended (cancelled) and gone: nothing is left to read
                    await self._lost(routed, verifier)
                elif isinstance(exc, SdcpProblem) and exc.status < 500 and exc.suffix != "sdcp-stale-epoch":
                    raise
                # The verifier is gone or fenced: wait for the fail-over to name another.
                entry.changed.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(entry.changed.wait(), self.sweep_interval * 4)
                continue
            if out.epoch < epoch:
                continue
            epoch = out.epoch
            if out.final and not entry.routed.done:  # before the last yield: its reader may stop there
                entry.routed.done = True
                await self._persist(entry.routed)
            if out.from_ == index and out.tokens:
                index += len(out.tokens)
                if out.epoch == entry.routed.epoch:
                    note_progress(entry.routed, index, self.clock())
                yield out
            if out.final:
                if not out.tokens:
                    yield out
                return

    async def _poll_output(self, entry: _Routed, verifier: str, index: int, poll: float | None) -> Output | None:
        """One output long-poll at ``verifier``, given up (None) once a fail-over opened the
        session elsewhere: a stopped or partitioned verifier answers nothing and resets nothing,
        and its poll would hold the stream until it came back."""
        opened = entry.opened
        call = asyncio.ensure_future(self.client.output(verifier, entry.routed.session, index, timeout=poll))
        try:
            while True:
                changed = asyncio.ensure_future(entry.changed.wait())
                try:
                    # The timeout only backs up the event: a fail-over sets it once the new verifier holds the session.
                    done, _ = await asyncio.wait((call, changed), timeout=self.sweep_interval * 4,
                                                 return_when=asyncio.FIRST_COMPLETED)
                finally:
                    changed.cancel()
                if call in done:
                    return call.result()
                if entry.opened is not opened:
                    return None
                if changed in done:
                    entry.changed.clear()  # an event or a cancel: the poll answers those itself
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
        entry = self.sessions.get(session)
        if entry is None or entry.routed.done:
            return
        routed = entry.routed
        routed.done = True
        self._undelivered.pop(session, None)
        entry.changed.set()
        await self._persist(routed)
        log.info("session %s: cancelled (%s) at verifier %s", session.hex(), why, routed.verifier)
        try:
            await self.client.cancel(routed.verifier, session)
        except (ConnectionError, TimeoutError, OSError, SdcpProblem) as exc:
            log.warning("session %s: cancel at verifier %s failed: %s", session.hex(), routed.verifier, exc)
