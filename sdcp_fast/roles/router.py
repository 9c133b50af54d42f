"""The router role (§6.1, §6.5.2, §6.6, §6.9): status table, session creation, assignment,
events, policy updates, fail-over, and the front end's view of a session's output.

Resources (Table 1): ``PUT instances/{id}/status``, ``POST events``. Sessions are opened
through :meth:`RouterRole.open` (the front end's call): pick a verifier, ``POST sessions``
(epoch 1, commit log in the MLC), then a drafter, informing the verifier before the drafter.
A periodic sweep reassigns sessions whose drafter's status expired and fails over sessions
whose verifier's status expired: fence, read the last record, open elsewhere with
``resume``, re-send the sampling policy, re-assign. Its watchdog looks at every session that
committed nothing for a few ttl_ms: it moved on, the verifier decodes it, or it gets a drafter
again (protocol/routing.py; docs/reliability.md, "Drafter death").
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
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
    SessionOpen,
    Status,
)
from sdcp_fast.protocol.commitlog import CommitRecord
from sdcp_fast.protocol.messages import ROLE_DRAFTER, ROLE_VERIFIER, RULE_GREEDY, parse_instance_path_id
from sdcp_fast.protocol.peer import PeerRole, require_role, same_instance
from sdcp_fast.protocol.problems import Busy, Forbidden
from sdcp_fast.protocol.routing import (
    RoutedSession,
    after_open,
    after_probe,
    assign,
    confirmed,
    expired_drafters,
    expired_verifiers,
    fence_for,
    new_session_id,
    note_progress,
    on_event,
    open_message,
    plan_failover,
    policy_update,
    stalled,
)
from sdcp_fast.protocol.status_table import StatusTable, choose_drafter, choose_verifier
from sdcp_fast.roles.metrics import RouterMetrics
from sdcp_fast.roles.objects import Objects
from sdcp_fast.roles.wire import Routes, SdcpClient, decode_body
from sdcp_fast.store.interface import Store
from sdcp_fast.transport.base import Request, Response, Transport

log = logging.getLogger("sdcp_fast.router")

KV_PROBES = 4  # epochs looked back for target KV pages at a fail-over


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


@dataclass
class _Routed:
    routed: RoutedSession
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    opened: SessionOpen | None = None  # the session-open its verifier holds: sent again, it says where it stands
    writers: dict[int, str] = field(default_factory=dict)  # epoch -> its verifier, who names its committed_tokens


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
        async with self._lock:
            if event.epoch == entry.routed.epoch:
                note_progress(entry.routed, event.committed, self.clock())
            assignment = on_event(entry.routed, event, self.table, self.clock())
            if assignment is not None:
                await self._assign(entry.routed, assignment)
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

    async def open(self, spec: SessionSpec) -> RoutedSession:
        """Create a session (§6.1): POST sessions at a live verifier, then assign a drafter."""
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
        self.sessions[session] = _Routed(routed, opened=opened, writers={1: verifier})
        note_progress(routed, state.committed, self.clock())
        self.metrics.sessions.inc()
        async with self._lock:
            assignment = after_open(routed, state, self.table, self.clock())
            if assignment is not None:
                await self._assign(routed, assignment)
        return routed

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

    async def output(self, session: bytes, *, poll: float | None = None) -> AsyncIterator[Output]:
        """The session's committed output as it grows, by index, across fail-overs: output of
        an epoch lower than one already seen is discarded, so nothing repeats or goes
        missing (§6.7)."""
        entry = self.sessions[session]
        index, epoch = 0, 0
        while True:
            routed = entry.routed
            verifier = routed.verifier
            try:
                out = await self.client.output(verifier, session, index, timeout=poll)
            except (ConnectionError, TimeoutError, OSError, SdcpProblem) as exc:
                if isinstance(exc, SdcpProblem) and exc.suffix == "sdcp-unknown-session":
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
            if out.from_ == index and out.tokens:
                index += len(out.tokens)
                if out.epoch == entry.routed.epoch:
                    note_progress(entry.routed, index, self.clock())
                yield out
            if out.final:
                if not out.tokens:
                    yield out
                entry.routed.done = True
                return

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
        log.info("session %s: cancelled (%s) at verifier %s", session.hex(), why, routed.verifier)
        try:
            await self.client.cancel(routed.verifier, session)
        except (ConnectionError, TimeoutError, OSError, SdcpProblem) as exc:
            log.warning("session %s: cancel at verifier %s failed: %s", session.hex(), routed.verifier, exc)

    # -- assignment and recovery ----------------------------------------------------------

    async def _assign(self, routed: RoutedSession, assignment: Assignment) -> None:
        """Inform the verifier, then the drafter, with the verifier's current state (§6.1)."""
        state = await self.client.put_drafter(routed.verifier, assignment)
        self.metrics.assignments.inc()
        try:
            # Bounded: a hung drafter would otherwise hold the lock, and with it every other
            # reassignment and fail-over, for the transport's whole timeout. The verifier already
            # knows the drafter; a late delivery is harmless, and its expiry reassigns the session.
            await asyncio.wait_for(self.client.assign(assignment.drafter, confirmed(routed, state)),
                                   max(4 * self.sweep_interval, 1.0))  # room for _call_again's tries
        except (ConnectionError, TimeoutError, OSError, SdcpProblem) as exc:
            log.warning("session %s: assignment to %s failed: %s", assignment.session.hex(), assignment.drafter, exc)
            # A drafter that never got it never proposes, and its status stays fresh, so no
            # expiry would ever reassign the session: the sweep delivers it again.
            self._undelivered[assignment.session] = assignment
        else:
            self._undelivered.pop(assignment.session, None)

    async def _sweeper(self) -> None:
        while True:
            await asyncio.sleep(self.sweep_interval)
            try:
                await self.sweep()
            except Exception:
                log.exception("router sweep failed")

    async def sweep(self) -> None:
        """Reassign sessions of expired drafters; fail over sessions of expired verifiers (§6.9)."""
        now = self.clock()
        open_ = [e.routed for e in self.sessions.values() if not e.routed.done]
        async with self._lock:
            for routed in expired_drafters(open_, self.table, now):
                await self._look_at(routed, f"drafter {routed.drafter} expired")
            for routed in stalled(open_, self.table, now, ttls=self.stall_ttls):
                await self._look_at(routed, f"nothing committed for {now - (routed.progress or now):.1f} s")
            for routed in open_:
                # No drafter was live when it opened (§6.1): assign one once one reports.
                late = assign(routed, self.table, now) if routed.drafter is None else None
                if late is not None:
                    with contextlib.suppress(ConnectionError, TimeoutError, OSError, SdcpProblem):
                        await self._assign(routed, late)
            for session, assignment in list(self._undelivered.items()):
                routed = self.sessions[session].routed
                if routed.done or routed.drafter != assignment.drafter or routed.epoch != assignment.epoch:
                    del self._undelivered[session]  # since replaced, or over
                    continue
                with contextlib.suppress(ConnectionError, TimeoutError, OSError, SdcpProblem):
                    await self._assign(routed, assignment)
            for routed in expired_verifiers(open_, self.table, now):
                await self._failover(routed)

    async def _look_at(self, routed: RoutedSession, why: str) -> None:
        """Ask the verifier where the session stands (its session-open again: idempotent,
        §6.1), then give it a drafter unless it moved on or the verifier decodes it itself."""
        entry = self.sessions[routed.session]
        if routed.done or entry.opened is None or entry.opened.epoch != routed.epoch:
            return  # ended (a cancel too) since the sweep began, or moved
        try:
            state = await self.client.open_session(routed.verifier, entry.opened)
        except (ConnectionError, TimeoutError, OSError, SdcpProblem) as exc:
            log.warning("session %s: %s; verifier %s did not say where it stands: %s",
                        routed.session.hex(), why, routed.verifier, exc)
            return
        if state.epoch == routed.epoch and state.committed < routed.seen:
            # It knows less than was already committed: it lost the session (a restart) and the
            # open made it afresh. As for an output reader told sdcp-unknown-session: fail over.
            log.warning("session %s: verifier %s no longer had it", routed.session.hex(), routed.verifier)
            await self._failover(routed)
            return
        before = routed.drafter
        now = self.clock()
        assignment = after_probe(routed, state, self.table, now)
        if assignment is None:
            if routed.self_decoding:
                log.info("session %s: %s; the verifier decodes it itself", routed.session.hex(), why)
            elif state.state is None and choose_drafter(self.table, routed.contract, now) is None:
                await self._drop_drafter(routed, why, state.committed)
            return
        log.warning("session %s: %s at %d tokens; assigning %s (was %s)", routed.session.hex(), why,
                    state.committed, assignment.drafter, before)
        with contextlib.suppress(ConnectionError, TimeoutError, OSError, SdcpProblem):
            await self._assign(routed, assignment)

    async def _drop_drafter(self, routed: RoutedSession, why: str, committed: int) -> None:
        """No live drafter may take a stalled session: the verifier decodes it itself
        (docs/reliability.md, "Drafter death") until an assignment ends that."""
        try:
            state = await self.client.drop_drafter(routed.verifier, routed.session)
        except (ConnectionError, TimeoutError, OSError, SdcpProblem) as exc:
            log.warning("session %s: %s at %d tokens; no live drafter, and verifier %s did not take it: %s",
                        routed.session.hex(), why, committed, routed.verifier, exc)
            return
        if state.state is not None and Action.parse(int(state.state)) is Action.SELF_DECODE:
            log.warning("session %s: %s at %d tokens; no live drafter: the verifier decodes it itself",
                        routed.session.hex(), why, committed)
        else:
            log.warning("session %s: %s at %d tokens; no live drafter, and the contract does not let the "
                        "verifier decode it: it waits for one", routed.session.hex(), why, committed)

    async def _lost(self, routed: RoutedSession, verifier: str) -> None:
        """The verifier of record no longer knows the session: it restarted before its status
        expired, so the sweep would never fail the session over (§6.9). Fail it over now,
        unless that already happened."""
        async with self._lock:
            if not routed.done and routed.verifier == verifier:
                log.warning("session %s: verifier %s no longer has it", routed.session.hex(), verifier)
                await self._failover(routed)

    async def _target_kv(self, session: bytes, epoch: int) -> str | None:
        """The newest target KV pages in the MLC (§6.9 "if available"): each verifier publishes
        its epoch's (roles/verifier.py); one that died before its first publish left none, and
        an older epoch's still hold a prefix of the committed tokens, which the new verifier
        checks. A few probes, then none: the new verifier computes the prefix itself."""
        for e in range(epoch, max(0, epoch - KV_PROBES), -1):
            ref = object_uri(self.scope, session, "target_kv", e)
            try:
                if await self.objects.exists(ref):
                    return ref
            except Exception as exc:  # the pages are an optimisation: never a reason not to fail over
                log.warning("session %s: could not look for %s: %s", session.hex(), ref, exc)
                return None
        return None

    def _tokens_ref(self, session: bytes, epoch: int) -> str:
        """The committed_tokens object of ``epoch``: named for the verifier the session was
        opened at for that epoch, so only it can have made it (docs/security.md, "Names
        nobody can squat")."""
        writer = self.sessions[session].writers.get(epoch)
        return object_uri(self.scope, session, "committed_tokens", epoch,
                          tag=None if writer is None else writer_tag(writer))

    async def _failover(self, routed: RoutedSession) -> None:
        """§6.9: fence the log at the next epoch, read the last commit record, open the
        session at another verifier with ``resume`` and the current sampling, re-assign."""
        old = routed.verifier
        target = choose_verifier(self.table, self.clock(), exclude=(old,))
        if target is None:
            return
        log_ = await self.mlc.commit_log(routed.commit_log)
        await log_.append(fence_for(routed), None)
        # Read after the fence: nothing the old verifier appends can follow it.
        view = await log_.read()
        last = next((r for r in reversed(view.records) if isinstance(r, CommitRecord)), None)
        # The resumed prefix: the new verifier takes it from the log, which holds every emitted
        # token, and from this object only where the log does not (roles/verifier_commit.py).
        written = None if last is None else self._tokens_ref(routed.session, last.epoch)
        pages = None if last is None else await self._target_kv(routed.session, last.epoch)
        plan = plan_failover(routed, target, last, committed_tokens=written, target_kv=pages)
        self.metrics.failovers.inc()
        log.warning("session %s: verifier %s expired, failing over to %s at epoch %d",
                    routed.session.hex(), old, target, routed.epoch)
        state = await self.client.open_session(target, plan.open)
        self.sessions[routed.session].opened = plan.open
        # The new verifier writes the output of the new epoch to its own object (roles/verifier.py).
        self.sessions[routed.session].writers[routed.epoch] = target
        routed.committed_tokens = self._tokens_ref(routed.session, routed.epoch)
        for policy in (plan.policy, *plan.later):
            if policy is not None:
                await self.client.policy(target, policy)
        assignment = after_open(routed, state, self.table, self.clock())
        if assignment is not None:
            await self._assign(routed, assignment)
        self.sessions[routed.session].changed.set()
