"""The router's assignment and recovery (§6.1, §6.9): delivering assignments, the periodic
sweep that reassigns sessions of expired drafters and fails over sessions of expired
verifiers, and the watchdog that looks at sessions that committed nothing for a few ttl_ms
(docs/reliability.md, "Drafter death"). The decisions are protocol/routing.py's (time passed
in); this module carries them out. :class:`RouterRole` (roles/router.py) is the role itself; it
builds a :class:`Recovery` with the parts both share.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from sdcp_fast.cache import object_uri
from sdcp_fast.cache.uri import writer_tag
from sdcp_fast.protocol import Action, Assignment, SdcpProblem, SessionState
from sdcp_fast.protocol.commitlog import CommitRecord
from sdcp_fast.protocol.routing import (
    FailoverPlan,
    RoutedSession,
    after_open,
    after_probe,
    assign,
    confirmed,
    expired_drafters,
    expired_verifiers,
    fence_for,
    plan_failover,
    stalled,
)
from sdcp_fast.protocol.status_table import StatusTable, choose_drafter, choose_verifier
from sdcp_fast.roles.metrics import RouterMetrics
from sdcp_fast.roles.objects import Objects
from sdcp_fast.roles.router_records import RecordStore
from sdcp_fast.roles.wire import SdcpClient
from sdcp_fast.store.interface import Store

log = logging.getLogger("sdcp_fast.router")

KV_PROBES = 4  # epochs looked back for target KV pages at a fail-over


class Recovery:
    """The router's assignment and recovery: it delivers assignments, writes routing records,
    and runs the sweep, the watchdog and fail-overs over the router's sessions. It is given
    the parts it shares with :class:`~sdcp_fast.roles.router.RouterRole`, which builds it: the
    sessions routed (each :class:`RoutedSession` is also its routing record), an event per
    session that wakes its output reader when it moved, the status table, the client, the
    record store, the MLC. ``lock`` makes one assignment, reassignment or fail-over at a time;
    ``undelivered`` holds assignments whose drafter did not get them, for the sweep to send again."""

    def __init__(self, *, uri: str, client: SdcpClient, mlc: Store, objects: Objects, records: RecordStore,
                 metrics: RouterMetrics, table: StatusTable, sessions: dict[bytes, RoutedSession],
                 changed: dict[bytes, asyncio.Event], scope: bytes, sweep_interval: float, stall_ttls: float,
                 clock: Callable[[], float]) -> None:
        self.uri, self.client, self.mlc, self.objects, self.records = uri, client, mlc, objects, records
        self.metrics, self.table, self.sessions, self.changed = metrics, table, sessions, changed
        self.scope, self.sweep_interval, self.stall_ttls, self.clock = scope, sweep_interval, stall_ttls, clock
        self.lock = asyncio.Lock()
        # The longest a call to a verifier under the lock may take: one that does not answer (a
        # stopped or partitioned one, not yet expired) is asked again at a later sweep.
        self.call_bound = max(10 * sweep_interval, 5.0)
        self.undelivered: dict[bytes, Assignment] = {}

    async def assign(self, routed: RoutedSession, assignment: Assignment) -> None:
        """Inform the verifier, then the drafter, with the verifier's current state (§6.1)."""
        try:
            # Bounded like the drafter's delivery below: every caller holds the lock, and a stopped
            # verifier (SIGSTOP, not yet expired) would hold it, and with it the fail-over that
            # moves its sessions away, until it is continued.
            state = await asyncio.wait_for(self.client.put_drafter(routed.verifier, assignment), self.call_bound)
        except (ConnectionError, TimeoutError, OSError) as exc:
            log.warning("session %s: verifier %s was not told of drafter %s: %s", assignment.session.hex(),
                        routed.verifier, assignment.drafter, exc)
            # The sweep sends it again, unless the verifier's expiry fails the session over first.
            self.undelivered[assignment.session] = assignment
            await self.persist(routed)
            return
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
            self.undelivered[assignment.session] = assignment
        else:
            self.undelivered.pop(assignment.session, None)
        await self.persist(routed)

    async def persist(self, routed: RoutedSession) -> None:
        """Write the session's routing record (roles/router_records.py), unless another router
        took it over (:meth:`still_ours`): that one's record is not this router's to rewrite."""
        if self.sessions.get(routed.session) is routed:
            await self.records.write(routed)

    async def still_ours(self, routed: RoutedSession) -> bool:
        """Whether no other router took the session over (a client resumed its stream there):
        one that did routes it from now on, so this router lets it go."""
        record = await self.records.read(routed.session)
        if record is None or record.router.rstrip("/") == self.uri.rstrip("/"):
            return True
        log.info("session %s: router %s routes it now; letting it go", routed.session.hex(), record.router)
        self.sessions.pop(routed.session, None)
        self.changed.pop(routed.session, None)
        self.undelivered.pop(routed.session, None)
        await self.records.forget({routed.session})
        return False

    async def run(self) -> None:
        """The sweep, every ``sweep_interval`` seconds, until cancelled."""
        while True:
            await asyncio.sleep(self.sweep_interval)
            try:
                await self.sweep()
            except Exception:
                log.exception("router sweep failed")

    async def sweep(self) -> None:
        """Reassign sessions of expired drafters; fail over sessions of expired verifiers (§6.9)."""
        now = self.clock()
        open_ = [r for r in self.sessions.values() if not r.done]
        async with self.lock:
            for routed in expired_drafters(open_, self.table, now):
                await self._look_at(routed, f"drafter {routed.drafter} expired")
            for routed in stalled(open_, self.table, now, ttls=self.stall_ttls):
                await self._look_at(routed, f"nothing committed for {now - (routed.watch.progress or now):.1f} s")
            for routed in open_:
                # No drafter was live when it opened (§6.1): assign one once one reports.
                late = assign(routed, self.table, now) if routed.drafter is None else None
                if late is not None:
                    with contextlib.suppress(ConnectionError, TimeoutError, OSError, SdcpProblem):
                        await self.assign(routed, late)
            for session, assignment in list(self.undelivered.items()):
                pending = self.sessions.get(session)
                if (pending is None or pending.done or pending.drafter != assignment.drafter
                        or pending.epoch != assignment.epoch):
                    del self.undelivered[session]  # since replaced, or over
                    continue
                if self.table.expired(pending.verifier, now):
                    continue  # its fail-over below assigns a drafter
                with contextlib.suppress(ConnectionError, TimeoutError, OSError, SdcpProblem):
                    await self.assign(pending, assignment)
            expired = expired_verifiers(open_, self.table, now)
            # A fail-over no target answered left the session fenced and opened nowhere.
            unfinished = [r for r in open_ if r.opened.epoch != r.epoch and all(r is not e for e in expired)]
            for routed in (*expired, *unfinished):
                await self._failover(routed)

    async def _look_at(self, routed: RoutedSession, why: str) -> None:
        """Ask the verifier where the session stands (its session-open again: idempotent,
        §6.1), then give it a drafter unless it moved on or the verifier decodes it itself."""
        if routed.session not in self.sessions or routed.done or routed.opened.epoch != routed.epoch:
            return  # ended (a cancel too) since the sweep began, or moved
        if not await self.still_ours(routed):
            return
        try:
            # Bounded: a hung verifier (stopped, not yet expired) would otherwise hold the sweep,
            # and every fail-over behind it, for the transport's whole timeout; the next sweep asks again.
            state = await asyncio.wait_for(self.client.open_session(routed.verifier, routed.opened), self.call_bound)
        except (ConnectionError, TimeoutError, OSError, SdcpProblem) as exc:
            if isinstance(exc, SdcpProblem) and exc.suffix == "sdcp-stale-epoch":
                # The log moved past the open the verifier was asked again (it restarted and
                # lost the session): it serves it no more, and a session nobody reads has no
                # output reader to notice. Fail over from the log's last record.
                log.warning("session %s: %s; verifier %s refused it: %s", routed.session.hex(), why,
                            routed.verifier, exc)
                await self._failover(routed, again=routed.verifier)
                return
            log.warning("session %s: %s; verifier %s did not say where it stands: %s",
                        routed.session.hex(), why, routed.verifier, exc)
            return
        if state.epoch == routed.epoch and state.committed < routed.watch.seen:
            # It knows less than was already committed: it lost the session (a restart) and the
            # open made it afresh. As for an output reader told sdcp-unknown-session: fail over.
            log.warning("session %s: verifier %s no longer had it", routed.session.hex(), routed.verifier)
            await self._failover(routed, again=routed.verifier)
            return
        before = routed.drafter
        now = self.clock()
        assignment = after_probe(routed, state, self.table, now)
        if assignment is None:
            if routed.watch.self_decoding:
                log.info("session %s: %s; the verifier decodes it itself", routed.session.hex(), why)
            elif state.state is None and choose_drafter(self.table, routed.contract, now) is None:
                await self._drop_drafter(routed, why, state.committed)
            return
        log.warning("session %s: %s at %d tokens; assigning %s (was %s)", routed.session.hex(), why,
                    state.committed, assignment.drafter, before)
        with contextlib.suppress(ConnectionError, TimeoutError, OSError, SdcpProblem):
            await self.assign(routed, assignment)

    async def _drop_drafter(self, routed: RoutedSession, why: str, committed: int) -> None:
        """No live drafter may take a stalled session: the verifier decodes it itself
        (docs/reliability.md, "Drafter death") until an assignment ends that."""
        try:
            state = await asyncio.wait_for(self.client.drop_drafter(routed.verifier, routed.session), self.call_bound)
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

    async def lost(self, routed: RoutedSession, verifier: str) -> None:
        """The verifier of record no longer knows the session: it restarted before its status
        expired, so the sweep would never fail the session over (§6.9). Fail it over now,
        unless that already happened."""
        async with self.lock:
            if not routed.done and routed.verifier == verifier:
                log.warning("session %s: verifier %s no longer has it", routed.session.hex(), verifier)
                await self._failover(routed, again=verifier)

    async def _target_kv(self, routed: RoutedSession, epoch: int) -> str | None:
        """The newest target KV pages in the MLC (§6.9 "if available"): each verifier publishes
        its epoch's (roles/verifier_kv.py); one that died before its first publish left none, and
        an older epoch's still hold a prefix of the committed tokens, which the new verifier
        checks. Only pages named for the verifier the session was opened at for their epoch are
        taken (docs/security.md, "Names nobody can squat"). A few probes, then none: the new
        verifier computes the prefix itself."""
        session = routed.session
        for e in range(epoch, max(0, epoch - KV_PROBES), -1):
            writer = routed.writers.get(e)
            if writer is None:
                continue  # nobody known to have verified this epoch: no name is its verifier's
            ref = object_uri(self.scope, session, "target_kv", e, tag=writer_tag(writer))
            try:
                if await self.objects.exists(ref):
                    return ref
            except Exception as exc:  # the pages are an optimisation: never a reason not to fail over
                log.warning("session %s: could not look for %s: %s", session.hex(), ref, exc)
                return None
        return None

    def _tokens_ref(self, routed: RoutedSession, epoch: int) -> str:
        """The committed_tokens object of ``epoch``: named for the verifier the session was
        opened at for that epoch, so only it can have made it (docs/security.md, "Names
        nobody can squat")."""
        writer = routed.writers.get(epoch)
        return object_uri(self.scope, routed.session, "committed_tokens", epoch,
                          tag=None if writer is None else writer_tag(writer))

    async def _failover(self, routed: RoutedSession, *, again: str | None = None) -> None:
        """§6.9: fence the log at the next epoch, read the last commit record, open the
        session at another verifier with ``resume`` and the current sampling, re-assign.
        ``again``: a live verifier that lost the session (a restart) and may take it again
        when no other is live. Never raises: it runs for the sweep and for output readers,
        whose client streams a fail-over's trouble must not reach. A target that does not
        answer the open is left for the next live one, each behind a fence of its own (it may
        have taken the open before it went away); with none left, the sweep tries again."""
        tried: list[str] = [routed.verifier]
        while True:
            target = choose_verifier(self.table, self.clock(), exclude=tried)
            if target is None and again is not None and again not in tried[1:] and self.table.live(again, self.clock()):
                target = again
            if target is None:
                if routed.opened.epoch != routed.epoch:
                    log.warning("session %s: no live verifier answered the fail-over (tried %s); the sweep tries "
                                "again", routed.session.hex(), ", ".join(tried[1:]))
                return
            try:
                opened = await self._open_elsewhere(routed, target)
            except (ConnectionError, TimeoutError, OSError, SdcpProblem) as exc:
                log.warning("session %s: fail-over target %s did not take it: %s", routed.session.hex(), target, exc)
                tried.append(target)
                continue
            except Exception:
                log.exception("session %s: fail-over to %s failed", routed.session.hex(), target)
                return
            if opened is None:
                return
            break
        try:
            await self._settle(routed, target, *opened)
        except (ConnectionError, TimeoutError, OSError, SdcpProblem) as exc:
            # Opened there: if the new verifier went away meanwhile, its expiry fails the session over again.
            log.warning("session %s: after the fail-over to %s: %s", routed.session.hex(), target, exc)
        except Exception:
            log.exception("session %s: after the fail-over to %s", routed.session.hex(), target)
        self.moved(routed.session)

    async def _open_elsewhere(self, routed: RoutedSession,
                              target: str) -> tuple[FailoverPlan, SessionState] | None:
        """Fence, plan and open the session at ``target``: the plan and the target's answer;
        None when the session is no longer this router's to move. Raises what the open raised."""
        old = routed.verifier
        if routed.session not in self.sessions or routed.done or not await self.still_ours(routed):
            return None
        log_ = await self.mlc.commit_log(routed.commit_log)
        await log_.append(fence_for(routed), None)
        # Read after the fence: nothing the old verifier appends can follow it.
        view = await log_.read()
        last = next((r for r in reversed(view.records) if isinstance(r, CommitRecord)), None)
        # The resumed prefix: the new verifier takes it from the log, which holds every emitted
        # token, and from this object only where the log does not (roles/verifier_commit.py).
        written = None if last is None else self._tokens_ref(routed, last.epoch)
        pages = None if last is None else await self._target_kv(routed, last.epoch)
        plan = plan_failover(routed, target, last, committed_tokens=written, target_kv=pages)
        self.metrics.failovers.inc()
        log.warning("session %s: verifier %s expired, failing over to %s at epoch %d",
                    routed.session.hex(), old, target, routed.epoch)
        # Bounded, more loosely than the other calls: a resume reads the log and the output, and
        # a target that does not answer is passed over behind a fence of its own.
        state = await asyncio.wait_for(self.client.open_session(target, plan.open), 3 * self.call_bound)
        routed.opened = plan.open
        return plan, state

    async def _settle(self, routed: RoutedSession, target: str, plan: FailoverPlan, state: SessionState) -> None:
        """The rest of a fail-over once ``target`` holds the session: its output object, the
        sampling updates, a drafter, the routing record."""
        # The new verifier writes the output of the new epoch to its own object (roles/verifier.py).
        routed.writers[routed.epoch] = target
        routed.committed_tokens = self._tokens_ref(routed, routed.epoch)
        if state.state is not None and Action.parse(int(state.state)) in (Action.FINISH, Action.FAIL):
            # Resumed at its end (its last record was its last round): nothing is left to route,
            # and a session nobody reads would otherwise be failed over at every later fault.
            routed.follow(state)
            routed.done = True
            await self.persist(routed)
            return
        for policy in (plan.policy, *plan.later):
            if policy is not None:
                await self.client.policy(target, policy)
        assignment = after_open(routed, state, self.table, self.clock())
        if assignment is not None:
            await self.assign(routed, assignment)
        else:
            await self.persist(routed)
    def moved(self, session: bytes) -> None:
        """Wake the session's output reader: it ended, or its verifier or drafter changed."""
        changed = self.changed.get(session)
        if changed is not None:
            changed.set()
