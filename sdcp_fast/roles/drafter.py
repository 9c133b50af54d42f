"""The drafter role (§6.2, §6.9): assignments, drafting, proposals, retries, and status
reports; the q rows it puts under a lease in the MLC are :mod:`drafter_q_rows`'s.

Resource (Table 1): ``POST assignments``. Each assigned session runs one loop: draft M
tokens from the committed prefix the drafter learned (from the assignment, the
``committed_tokens`` object and verdicts, never from the verifier's memory), publish the
rows under a lease, propose, follow the verdict or problem, release the lease. One
proposal is outstanding per session (§6.2); a proposal whose verdict did not arrive is sent
again unchanged (§6.9).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch

from sdcp_fast.cache import ObjectUnavailable, object_uri
from sdcp_fast.cache.uri import writer_tag
from sdcp_fast.model.interfaces import Drafter
from sdcp_fast.protocol import (
    Assignment,
    BadRequest,
    Proposal,
    Sampling,
    SdcpProblem,
    Status,
    Verdict,
    contract_digest,
    extend_digest,
    prefix_digest,
)
from sdcp_fast.protocol.drafting import AcceptanceEstimator, DrafterSession, state_from_problem
from sdcp_fast.protocol.messages import ROLE_DRAFTER, RULE_GREEDY
from sdcp_fast.protocol.peer import PeerRole, require_role
from sdcp_fast.roles.drafter_q_rows import QRows
from sdcp_fast.roles.load import BusyMeter
from sdcp_fast.roles.metrics import DrafterMetrics
from sdcp_fast.roles.objects import Objects
from sdcp_fast.roles.retry import backoff, retrying, unreachable_or_5xx
from sdcp_fast.roles.wire import Routes, SdcpClient, decode_body, report_status_forever, to_every_router
from sdcp_fast.store.interface import Store
from sdcp_fast.transport.base import Request, Transport

log = logging.getLogger("sdcp_fast.drafter")

PROPOSAL_BACKOFF = 0.02  # seconds before the second try of a proposal or a q-row put; doubling, at most 1 s
# A hop to the drafting thread (submit, the worker's wake-up, the future's call back into the
# loop) costs some 50-100 us of CPU on a loaded host: more than a draft that returns ready
# tokens. A model whose recent drafts took less than this runs on the loop's thread; a real
# model's millisecond drafts stay on the drafting thread, so the loop serves meanwhile. The
# bar is the hop's cost, not a fraction of it: a draft of a few microseconds measures 10-30 us
# on the loop's thread of a busy host (its code no longer in the caches), and at a 20 us bar
# about half of bench/protocol.py's rule-2 drafts went to the thread, each hop costing more
# than the draft it moved.
INLINE_DRAFT_S = 50e-6


class Resync(Exception):
    """The drafter's view of the committed prefix could not be brought up to date."""


@dataclass
class _Prepared:
    """A next proposal drafted while the verifier checked the last one (§6.2 MAY)."""

    guess: int  # the target's extra token, as this drafter guesses it
    tokens: list[int]
    q_rows: Any
    confirmed: bool = False  # the verdict emitted exactly the proposal plus the guess


@dataclass
class _Assigned:
    record: DrafterSession
    prompt: tuple[int, ...]
    output: list[int]  # committed output o[1..n] as learned
    task: asyncio.Task[None] | None = None
    rule: int = field(init=False)
    sampling: Sampling = field(init=False)  # the profile drafts sample with

    def __post_init__(self) -> None:
        a = self.record.assignment
        self.rule = a.contract.rule
        self.sampling = a.sampling or a.contract.sampling or Sampling()


class DrafterRole:
    def __init__(
        self,
        drafter: Drafter,
        *,
        uri: str,
        mlc: Store,
        transport: Transport,
        router: str | None = None,
        seed: int = 0,
        fixed_m: int | None = None,
        status_ttl_ms: int = 10_000,
        offload: bool = False,
        # About 35 s of retries (backoff capped at 1 s): enough to ride out a restart of the
        # MLC or of the verifier; a new assignment (a fail-over) replaces the attempt sooner.
        retries: int = 40,
        speculate: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.drafter = drafter
        self.uri = uri
        self.router = router
        self.seed = seed
        # None: choose M by §6.2 from measured alpha, t_d and t_v; a number: always the
        # largest M up to it that the limit allows (seeded runs then repeat exactly).
        self.fixed_m = fixed_m
        self.status_ttl_ms = status_ttl_ms
        self.retries = retries
        # Preparing the next proposal pays only where drafting runs beside the event loop;
        # None: prepare while drafts go to the drafting thread (see INLINE_DRAFT_S).
        self.speculate = False if not offload and speculate is None else speculate
        self.speculation = {"prepared": 0, "used": 0}  # next proposals drafted ahead, and sent
        self.clock = clock
        self.client = SdcpClient(transport)
        # Drafting leaves the event loop in a service (one thread: a model's per-session
        # caches are not shared across threads); in process it runs inline.
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="drafter") if offload else None
        self.objects = Objects(mlc, self._executor)
        self.busy = BusyMeter(clock=clock)
        self.acceptance = AcceptanceEstimator()
        self._t_draft = 1e-3  # EWMA seconds per drafted token (§6.2 t_d)
        self._t_verify = 1e-2  # EWMA seconds from proposal to verdict (§6.2 t_v)
        # The model's own seconds per propose call, recent: unknown (slow) until measured.
        self._t_propose = self._t_last = 1e-3
        self._offloaded = 0  # drafts handed to the drafting thread and not yet back
        self._drained = asyncio.Event()  # set while _offloaded is 0
        self._drained.set()
        self._random = torch.Generator()  # the drafts' randoms, seeded per draft (_propose)
        self._status: Status | None = None
        self._sessions: dict[bytes, _Assigned] = {}
        self.problems: dict[bytes, list[str]] = {}  # problem types answered to each session's proposals
        self._waiting = 0  # sessions ready to draft, not drafting
        self._tasks: list[asyncio.Task[None]] = []
        self.routes = Routes()
        self.metrics = DrafterMetrics.mount(self.routes)
        self.q_rows = QRows(self.objects, uri, attempts=retries + 1, first_delay=PROPOSAL_BACKOFF,
                            on_retry=self.metrics.store_retries.inc)
        self.routes.add("POST", r"assignments", self._post_assignment)

    @property
    def handler(self) -> Routes:
        return self.routes

    @property
    def name(self) -> str:
        return self.drafter.name

    # -- life cycle -----------------------------------------------------------------------

    async def start(self) -> None:
        if self.router is not None:
            self._tasks.append(asyncio.create_task(self._report_status(), name="drafter-status"))

    async def close(self) -> None:
        tasks = [*self._tasks, *(a.task for a in self._sessions.values() if a.task is not None)]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for session in list(self._sessions):
            self.drafter.release(session)
        self._sessions.clear()
        if self._executor is not None:
            self._executor.shutdown(wait=False)

    def status(self) -> Status:
        load, queue, accept_milli = self.busy.percent(), self._waiting, self.acceptance.accept_milli
        last = self._status  # every proposal carries one: made again only when a figure moved
        if last is None or last.load != load or last.queue != queue or last.accept_milli != accept_milli \
                or last.ttl_ms != self.status_ttl_ms:
            last = self._status = Status(instance=self.uri, role=ROLE_DRAFTER, load=load, queue=queue,
                                         accept_milli=accept_milli, ttl_ms=self.status_ttl_ms)
        return last

    async def report_status(self) -> None:
        status = self.status()
        await to_every_router(self.router, lambda router: self.client.status(router, status))

    async def _report_status(self) -> None:
        await report_status_forever(self.report_status, self.status_ttl_ms, self.router)

    # -- POST assignments -----------------------------------------------------------------

    async def _post_assignment(self, request: Request) -> None:
        require_role(request.peer, PeerRole.ROUTER)
        assignment = decode_body(Assignment, request)
        if assignment.drafter.rstrip("/") != self.uri.rstrip("/"):
            raise BadRequest(f"assignment names drafter {assignment.drafter}, this is {self.uri}")
        old = self._sessions.pop(assignment.session, None)
        if old is not None and old.task is not None:
            old.task.cancel()
        prompt = assignment.prompt
        if isinstance(prompt, str):
            prompt = await self.objects.tokens(prompt)
        assigned = _Assigned(DrafterSession(assignment, estimator=self.acceptance), tuple(prompt), [])
        self._sessions[assignment.session] = assigned
        assigned.task = asyncio.create_task(self._run(assigned, None if old is None else old.task),
                                            name="drafter-session")
        return None

    async def _learn(self, assigned: _Assigned, committed: int, digest: bytes, ref: str | None) -> None:
        """Bring the committed output up to ``committed`` tokens with digest ``digest``: from
        what is already known when it matches, else from the ``committed_tokens`` object."""
        contract = assigned.record.assignment.contract
        d0 = prefix_digest(contract_digest(contract), assigned.prompt)
        known = assigned.output
        if len(known) >= committed and extend_digest(d0, known[:committed]) == digest:
            del known[committed:]
            return
        if ref is None and contract.scope is not None:
            ref = object_uri(contract.scope, assigned.record.session, "committed_tokens", assigned.record.epoch,
                             tag=writer_tag(assigned.record.assignment.verifier))  # the epoch's verifier wrote it
        if ref is None:
            raise BadRequest("the committed output is needed and no committed_tokens object is named")
        try:
            tokens = await self.objects.tokens(ref)
        except (ObjectUnavailable, OSError) as exc:
            raise Resync(f"{ref}: {exc}") from None
        tokens = tokens[:committed]
        if len(tokens) != committed or extend_digest(d0, tokens) != digest:
            raise Resync(f"{ref} does not hold the committed prefix of digest {digest.hex()[:12]}")
        assigned.output[:] = tokens

    # -- one session ----------------------------------------------------------------------

    async def _run(self, assigned: _Assigned, previous: asyncio.Task[None] | None = None) -> None:
        record = assigned.record
        session = record.session
        prepared: _Prepared | None = None
        sending: asyncio.Task[Verdict | None] | None = None
        try:
            if previous is not None:
                # The replaced run lets go of its q rows first: this run may name the same round's.
                await asyncio.wait([previous])
            await self._join(assigned)
            while record.stopped is None:
                m = self._choose_m(assigned) if prepared is not None and prepared.confirmed else 0
                if prepared is not None and prepared.confirmed and len(prepared.tokens) >= m:
                    # The M drafting now would choose; a prefix of a sequential draft is that draft.
                    self.speculation["used"] += 1
                    q = None if prepared.q_rows is None else prepared.q_rows[:m]
                    proposal, lease = await self._publish(assigned, prepared.tokens[:m], q)
                else:
                    # A model that drafts inline and rows-free: the proposal in plain calls
                    # (a round's coroutines and their frames are a good part of its CPU here).
                    result = self._draft_inline(assigned)
                    if result is not None and result.q_rows is None:
                        proposal, lease = self._publish_now(assigned, result.tokens), None
                    elif result is not None:
                        proposal, lease = await self._publish(assigned, result.tokens, result.q_rows)
                    else:
                        proposal, lease = await self._draft(assigned)
                prepared = None
                if not self._speculating():
                    try:
                        await self._send(assigned, proposal)
                    finally:
                        if lease is not None:
                            await self.q_rows.release(lease)
                    continue
                sending = asyncio.create_task(self._send(assigned, proposal))
                # While the verifier works: the next proposal, assuming this one is accepted
                # whole and the target's extra token is our own next guess (§6.2).
                try:
                    prepared = await self._prepare(assigned, proposal)
                    self.speculation["prepared"] += prepared is not None
                except Exception as exc:
                    log.debug("session %s: speculative draft failed: %s", session.hex(), exc)
                try:
                    verdict = await sending
                finally:
                    if lease is not None:
                        await self.q_rows.release(lease)
                if prepared is not None:
                    prepared.confirmed = verdict is not None and record.stopped is None and \
                        verdict.emitted == (*proposal.tokens, prepared.guess)
        except asyncio.CancelledError:
            raise
        except Resync as exc:
            log.warning("session %s: %s; waiting for a new assignment", session.hex(), exc)
        except Exception:
            log.exception("session %s failed at the drafter", session.hex())
        finally:
            if sending is not None and not sending.done():
                sending.cancel()
            current = self._sessions.get(session)
            if current is assigned:
                del self._sessions[session]
                self.drafter.release(session)
                self.q_rows.end(assigned.record)

    async def _join(self, assigned: _Assigned) -> None:
        """Learn the committed prefix the assignment names; the object may not be written yet
        when the assignment overtakes the verifier's write, so try a few times."""
        a = assigned.record.assignment
        await retrying(lambda _: self._learn(assigned, a.committed, a.digest, a.committed_tokens), attempts=6,
                       transient=lambda exc: isinstance(exc, Resync))

    def _speculating(self) -> bool:
        """Whether to prepare the next proposal during this round: as configured, else while
        drafts go to the drafting thread (a model too slow to draft inline)."""
        if self.speculate is not None:
            return self.speculate
        return self._executor is not None and self._t_propose >= INLINE_DRAFT_S

    def _seed(self, session: bytes, round_: int, purpose: bytes) -> int:
        # The drafter's own randoms, independent of the verifier's (§6.4) and of batching order.
        key = hashlib.sha256(b"sdcp-fast/draft\x00" + self.seed.to_bytes(8, "big") + session
                             + round_.to_bytes(8, "big") + purpose).digest()
        return int.from_bytes(key[:8], "big") >> 1

    def _draft_seed(self, assigned: _Assigned, round_: int, purpose: bytes) -> int | None:
        """The draft's seed; None under rule 1, where a draft is the model's greedy tokens
        and draws no randoms (seeding the generator costs some 4 us a draft, a good part of
        a cheap model's round)."""
        return None if assigned.rule == RULE_GREEDY else self._seed(assigned.record.session, round_, purpose)

    def _propose(self, assigned: _Assigned, context: tuple[int, ...], m: int, seed: int | None) -> Any:
        """The model's draft, timed; on whichever thread drafts (never two at once), so one
        generator serves every draft, seeded afresh (as a new one would be) when ``seed`` is
        given: :meth:`_draft_seed` says when."""
        generator = self._random
        if seed is not None:
            generator.manual_seed(seed)
        sampling = assigned.sampling
        start = time.perf_counter()
        result = self.drafter.propose(
            assigned.record.session, context, m, rule=assigned.rule, temperature_milli=sampling.temperature_milli,
            top_k=sampling.top_k, top_p_milli=sampling.top_p_milli, generator=generator)
        spent = time.perf_counter() - start
        # The cheaper of the last two: a lone slow draft (a collection, the host's scheduler)
        # moves nothing, two in a row send the next drafts to the drafting thread.
        self._t_propose = min(spent, self._t_last)
        self._t_last = spent
        return result

    def _choose_m(self, assigned: _Assigned, after: int = 0) -> int:
        record = assigned.record
        if self.fixed_m is not None:
            m = max(1, min(self.fixed_m, record.limit))
        else:
            m = record.choose_m(self._t_draft, self._t_verify)
        return max(1, min(m, record.assignment.contract.max_new - len(assigned.output) - after))

    def _draft_inline(self, assigned: _Assigned) -> Any | None:
        """:meth:`_draft`'s drafting where it runs on this thread now (no drafting thread, or
        a model fast enough for inline drafts and none offloaded): its result; else None."""
        if self._executor is not None and (self._t_propose >= INLINE_DRAFT_S or self._offloaded):
            return None
        record = assigned.record
        m = self._choose_m(assigned)
        round_ = record.round + 1
        seed = self._draft_seed(assigned, round_, b"")
        t0 = self.clock()
        result = self._propose(assigned, (*assigned.prompt, *assigned.output), m, seed)
        t1 = self.clock()
        self.busy.add(t0, t1)
        self._t_draft = 0.8 * self._t_draft + 0.2 * (t1 - t0) / max(1, len(result.tokens))
        return result

    async def _compute(self, assigned: _Assigned, context: tuple[int, ...], m: int, round_: int,
                       purpose: bytes = b"") -> Any:
        """Draft ``m`` tokens after ``context`` with the randoms of ``round_`` (and ``purpose``)."""
        seed = self._draft_seed(assigned, round_, purpose)
        executor = self._executor
        if executor is not None and self._t_propose < INLINE_DRAFT_S and self._offloaded:
            self._waiting += 1
            try:
                while self._t_propose < INLINE_DRAFT_S and self._offloaded:
                    await self._drained.wait()  # the model is never called from two threads at once
            finally:
                self._waiting -= 1
        t0 = self.clock()
        if executor is None or self._t_propose < INLINE_DRAFT_S:
            result = self._propose(assigned, context, m, seed)
        else:
            self._waiting += 1
            self._offloaded += 1
            self._drained.clear()
            try:
                result = await asyncio.get_running_loop().run_in_executor(executor, self._propose, assigned,
                                                                          context, m, seed)
            finally:
                self._waiting -= 1
                self._offloaded -= 1
                if not self._offloaded:
                    self._drained.set()
        t1 = self.clock()
        self.busy.add(t0, t1)
        self._t_draft = 0.8 * self._t_draft + 0.2 * (t1 - t0) / max(1, len(result.tokens))
        return result

    async def _draft(self, assigned: _Assigned) -> tuple[Proposal, str | None]:
        record = assigned.record
        m = self._choose_m(assigned)
        result = await self._compute(assigned, (*assigned.prompt, *assigned.output), m, record.round + 1)
        return await self._publish(assigned, result.tokens, result.q_rows)

    async def _prepare(self, assigned: _Assigned, proposal: Proposal) -> _Prepared | None:
        """The guess of the extra token, then the next round's tokens after it. The guess has
        randoms of its own, and the next round's draft takes that round's, so a confirmed
        preparation is exactly what drafting after the verdict would have proposed."""
        m = self._choose_m(assigned, after=len(proposal.tokens) + 1)
        if len(assigned.output) + len(proposal.tokens) + 1 >= assigned.record.assignment.contract.max_new:
            return None  # the session ends with this round if it is accepted whole
        context = (*assigned.prompt, *assigned.output, *proposal.tokens)
        guess = await self._compute(assigned, context, 1, proposal.round, purpose=b"guess")
        if not guess.tokens:
            return None
        result = await self._compute(assigned, (*context, guess.tokens[0]), m, proposal.round + 1)
        return _Prepared(guess=guess.tokens[0], tokens=list(result.tokens), q_rows=result.q_rows)

    def _publish_now(self, assigned: _Assigned, tokens: list[int]) -> Proposal:
        """:meth:`_publish` of a draft without q rows (nothing to put in the MLC)."""
        record = assigned.record
        if len(tokens) > record.limit:
            tokens = tokens[: record.limit]
        return record.propose(tokens, self.status())

    async def _publish(self, assigned: _Assigned, tokens: list[int], q_rows: Any) -> tuple[Proposal, str | None]:
        record = assigned.record
        if len(tokens) > record.limit:  # a prepared draft may be longer than the latest m_cap allows
            tokens = tokens[: record.limit]
        q_ref, lease = None, None
        if q_rows is not None:
            if len(q_rows) > len(tokens):  # a tensor's slice is a new view: only when it is shorter
                q_rows = q_rows[: len(tokens)]
            q_ref, lease = await self.q_rows.put(record, q_rows)
        return record.propose(tokens, self.status(), q_rows=q_ref), lease

    async def _send(self, assigned: _Assigned, proposal: Proposal) -> Verdict | None:
        """Propose until a verdict or a problem answers; None when the round produced no verdict."""
        record = assigned.record
        verifier = record.assignment.verifier

        async def propose(attempt: int) -> Verdict:
            sent = record.retry(self.status())
            t0 = self.clock()
            self.metrics.proposal(len(sent.tokens), attempt)
            verdict = await self.client.propose(verifier, sent)
            self._t_verify = 0.8 * self._t_verify + 0.2 * (self.clock() - t0)
            return verdict

        try:
            # The first try in this frame; the retries (§6.9) as retrying's attempts 1, 2, ...,
            # the same waits and the same transient failures as one retrying call of them all.
            try:
                t0 = self.clock()
                self.metrics.proposal(len(proposal.tokens), 0)
                verdict = await self.client.propose(verifier, proposal)
                self._t_verify = 0.8 * self._t_verify + 0.2 * (self.clock() - t0)
            except Exception as exc:
                if self.retries < 1 or not unreachable_or_5xx(exc):
                    raise
                await asyncio.sleep(backoff(0, PROPOSAL_BACKOFF))
                verdict = await retrying(lambda attempt: propose(attempt + 1), attempts=self.retries,
                                         first_delay=2 * PROPOSAL_BACKOFF)
        except SdcpProblem as problem:
            await self._on_problem(assigned, problem)
            return None
        except OSError as exc:  # no answer, after every try
            raise Resync(f"verifier {verifier} unreachable: {exc}") from None
        try:
            self._follow(assigned, verdict)
        except SdcpProblem as problem:  # a verdict that answers another request (a race)
            await self._on_problem(assigned, problem)
            return None
        return verdict

    def _follow(self, assigned: _Assigned, verdict: Verdict) -> None:
        record = assigned.record
        start = record.committed
        record.on_verdict(verdict)
        if verdict.committed != start + len(verdict.emitted):
            raise Resync("verdict's committed length does not extend the known prefix")
        assigned.output.extend(verdict.emitted)

    async def _on_problem(self, assigned: _Assigned, problem: SdcpProblem) -> None:
        record = assigned.record
        self.problems.setdefault(record.session, []).append(problem.suffix)
        if not record.on_problem(problem):
            log.info("session %s: stopped by %s", record.session.hex(), problem.suffix)
            return
        state = state_from_problem(problem)
        if state is not None and record.committed == state.committed and record.digest == state.digest:
            # on_problem adopted the verifier's state (stale base, §6.3): learn the tokens behind it,
            # from the object of the epoch that answered (its verifier wrote it before answering).
            scope = record.assignment.contract.scope
            ref = record.assignment.committed_tokens if scope is None else \
                object_uri(scope, record.session, "committed_tokens", state.epoch,
                           tag=writer_tag(record.assignment.verifier))
            await self._learn(assigned, state.committed, state.digest, ref)
