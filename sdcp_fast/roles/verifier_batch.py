"""The verifier's continuous batching (§6.3 Scoring): rounds wait in one queue, each pass
scores a batch of them through the target and the kernels, and the committer commits them
in batch order.

A batch opens with the first waiting round and closes when every session that owes a
proposal has sent it, or ``batch_wait`` seconds later, whichever is first
(docs/interpretations.md, "Verifier batching"); sessions that are self-decoding join every
batch. Rule 2's q rows are fetched and checked before a round joins the queue. What a pass
runs (which rounds, which prefill chunks, within which budget) is the plan of
:mod:`~sdcp_fast.roles.verifier_plan`, computed from the sessions' plain state; here, the
queue, the waiting and the pass that runs it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Callable, Sequence

import torch

from sdcp_fast.cache import ObjectUnavailable
from sdcp_fast.cache.uri import writer_tag
from sdcp_fast.model.interfaces import ScoreRequest, TargetScorer
from sdcp_fast.protocol import Proposal, QUnavailable, SdcpProblem, Verdict
from sdcp_fast.protocol.problems import InternalError
from sdcp_fast.protocol.registry import SessionRegistry
from sdcp_fast.protocol.session import State
from sdcp_fast.roles.scoring import verify_batch
from sdcp_fast.roles.verifier_commit import Committer
from sdcp_fast.roles.verifier_config import VerifierConfig, VerifierContext
from sdcp_fast.roles.verifier_plan import (
    GROW_BELOW,
    PREFILL_CHUNK_CPU,
    PREFILL_CHUNK_GPU,
    PREFILL_SOLO_CPU,
    PREFILL_SOLO_GPU,
    SHRINK_ABOVE,
    Limits,
    Plan,
    Queued,
    SessionNeed,
    SharedBudget,
    chunked,
    pending,
    plan,
    self_decode_due,
)
from sdcp_fast.roles.verifier_state import LiveSession, Round, retire_ended
from sdcp_fast.store.shm_client import ShmClient, rows_guard

log = logging.getLogger("sdcp_fast.verifier")

LONG_PREFILL = 1024  # tokens: a prefill this long is logged (start, end) with the session id
LONG_PASS = 5.0  # seconds: a pass this long is logged with its sessions' ids
# Neither ended nor committing: a session that may be fed prefill chunks (a tuple: its members
# are found by identity, where a set would call the enum's hash per session and pass).
_OPEN = (State.READY, State.SCORING, State.SELF_DECODING)


class Batcher:
    def __init__(self, scorer: TargetScorer, sessions: SessionRegistry[LiveSession], config: VerifierConfig,
                 context: VerifierContext, *, committer: Committer) -> None:
        self.scorer = scorer
        self.sessions = sessions
        self.objects = context.objects
        # The store's shared-memory client where it has one: rows read in place, no await.
        shm = getattr(getattr(context.objects, "store", None), "shm", None)
        self._shm = shm if isinstance(shm, ShmClient) else None
        self.committer = committer
        self.load = context.load
        self.metrics = context.metrics
        self.clock = clock = context.clock
        self._retired = 0.0  # when ended sessions were last retired
        # The config's, kept here: a harness may change max_batch on a built verifier.
        self.backend = config.backend
        self.max_batch = config.max_batch
        self.batch_wait = config.batch_wait
        self.self_decode_idle = config.self_decode_idle
        prefill_chunk, prefill_solo = config.prefill_chunk, config.prefill_solo
        if prefill_chunk is None:
            prefill_chunk = default_prefill_chunk(scorer)
        if prefill_solo is None:
            prefill_solo = default_prefill_chunk(scorer, solo=True)
        if prefill_chunk < 0 or prefill_solo < 0:
            raise ValueError("prefill_chunk and prefill_solo must be >= 0 (0: a context in one pass)")
        self.prefill_chunk = prefill_chunk
        # 0 (the rest in one pass) or at least the chunk: alone, a pass never feeds less.
        self.prefill_solo = prefill_solo and max(prefill_solo, prefill_chunk)
        # The module's constants, read here: a test (or a bench) may set them before it builds one.
        self.budget = SharedBudget(prefill_chunk, self.prefill_solo, grow_below=GROW_BELOW, shrink_above=SHRINK_ABOVE)
        self.target_passes = 0
        self.progress = clock()  # when a scoring pass last started or a round was committed
        self.wake = asyncio.Event()  # set on anything that may let a batch close sooner
        self._queue: list[Round] = []
        self._fetching = 0
        # Rounds whose q rows are read in place from a slot their writer rewrites: the check,
        # after the kernels read them, that they held still (store/shm_client.py).
        self._q_guards: dict[int, tuple[Round, Callable[[], bool]]] = {}
        # Proposals a gathering batch waits for before it counts the sessions that owe one again
        # (0 when none gathers: each proposal wakes the batcher), so that it does not walk every
        # session on each proposal's arrival.
        self._expected = 0

    @property
    def queued(self) -> int:
        """Rounds waiting for a pass, or for their q rows."""
        return len(self._queue) + self._fetching

    @property
    def shared_budget(self) -> int:
        """A pass's prefill tokens beside decoding rounds, at most (learnt: ``_adapt``)."""
        return self.budget.value

    def enqueue(self, item: Round) -> asyncio.Future[Verdict]:
        """Queue a drafter's round that needs no q rows; its future, settled by the pass that
        commits it (or drops it). A retry of the same request waits on that future
        (``live.waiters``), which :meth:`Round.settle` forgets when it answers."""
        future = item.future
        assert future is not None
        item.live.waiters.verdicts[item.work.round] = future
        self._queued(item)
        return future

    def _queued(self, item: Round) -> None:
        self._queue.append(item)
        self._expected -= 1
        if self._expected <= 0 or len(self._queue) >= self.max_batch:
            self.wake.set()

    async def submit(self, item: Round, proposal: Proposal) -> Verdict:
        """Queue a drafter's round (after its q rows, under rule 2) and wait for its verdict.

        The caller's cancellation (its client went away) leaves the round to be verified: a
        retry of the same request waits for its verdict (``live.waiters``). Not through
        ``asyncio.shield``, whose outer future and callbacks every round paid for: the round's
        future is only replaced by a fresh one, which the round settles instead."""
        verdicts, future, round_ = item.live.waiters.verdicts, item.future, item.work.round
        assert future is not None
        verdicts[round_] = future  # before the rows are fetched: retries wait on it
        if item.work.needs_q:
            try:
                await self._fetch_q(item, proposal)
            except BaseException:
                verdicts.pop(round_, None)
                raise
        self._queued(item)
        try:
            return await future
        except asyncio.CancelledError:
            if future.cancelled() and item.future is future:
                item.future = asyncio.get_running_loop().create_future()
                if verdicts.get(round_) is future:
                    verdicts[round_] = item.future
            raise
        finally:
            if verdicts.get(round_) is future and future.done():
                del verdicts[round_]

    def withdraw(self, live: LiveSession, problem: SdcpProblem) -> int:
        """Take ``live``'s rounds out of the queue unscored (a cancelled session), answering
        their drafters with ``problem``; how many there were."""
        mine = [item for item in self._queue if item.live is live]
        self._queue = [item for item in self._queue if item.live is not live]
        for item in mine:
            if item.live.session.state is State.SCORING:
                item.live.session.abandon()
            item.settle(problem)
        self.wake.set()  # a gathering batch no longer waits for this session
        return len(mine)

    @staticmethod
    @functools.lru_cache(maxsize=4096)
    def _drafter_tag(drafter: str) -> str:
        return writer_tag(drafter)

    def _foreign(self, rows: str, drafter: str | None) -> bool:
        """Whether rows named ``rows`` are named for another writer than ``drafter``: then they
        are not this drafter's, whoever wrote them (docs/security.md, "Names nobody can squat"),
        as if they could not be obtained. The tag is read off the name's last segment
        (``<round>.<tag>``, cache/uri.py) and the drafter's tag kept: parsing the name and
        hashing the drafter's URI each round took ~5 us, half of reading the rows in place. A
        name that does not parse fails the get."""
        tag = rows.rpartition("/")[2].partition(".")[2]
        return bool(drafter and tag and tag != self._drafter_tag(drafter))

    def enqueue_in_place(self, item: Round, proposal: Proposal) -> asyncio.Future[Verdict] | None:
        """Queue a rule-2 round whose rows its drafter's session slot on this host holds whole,
        read in place with no await (``ShmClient.in_place``), as :meth:`enqueue` queues a
        rule-1 round: no task and no read request per round. None when they are not there
        (another host's node, a slot not mapped yet, the wrong size, a name not this drafter's,
        any failure of the read): the caller takes :meth:`submit`'s way, whose read answers
        alike or finds the rows elsewhere. A refused check (a zero q) raises, nothing queued."""
        shm, rows = self._shm, proposal.q_rows
        if shm is None or not rows or self._foreign(rows, item.drafter):
            return None
        try:
            raw = shm.in_place(rows)
        except (ObjectUnavailable, OSError, ValueError):
            return None
        if raw is None or len(raw) != 4 * self.scorer.vocab_size * len(proposal.tokens):
            return None
        self.metrics.q_read(True)
        self._provide(item, raw)
        return self.enqueue(item)

    async def _fetch_q(self, item: Round, proposal: Proposal) -> None:
        """Rule 2's precondition: the rows of every position, checked, before any random value."""
        session, vocab = item.live.session, self.scorer.vocab_size
        rows = proposal.q_rows
        if rows and self._foreign(rows, item.drafter):
            rows = None
        self._fetching += 1
        try:
            raw = await self.objects.get(rows) if rows else None
        except (ObjectUnavailable, OSError, ValueError, SdcpProblem):
            raw = None  # the core answers sdcp-q-unavailable and commits nothing (§6.3)
        finally:
            self._fetching -= 1
        self.metrics.q_read(raw is not None)
        if raw is None or len(raw) != 4 * vocab * len(proposal.tokens):
            session.provide_q(q_rows=None, vocab=vocab)  # raises QUnavailable, round dropped
            raise QUnavailable("draft rows could not be obtained, whole")  # pragma: no cover
        self._provide(item, raw)

    def _provide(self, item: Round, raw: memoryview) -> None:
        """The core's check of ``raw`` (raising when it refuses them), then the round's rows and
        uniforms; rows read in place get the check, after the kernels, that they held still.
        Called right after the read, before the event loop runs anything else: the guard takes
        the rows' sequence number as read."""
        vocab = self.scorer.vocab_size
        guard = rows_guard(raw)
        item.uniforms = item.live.session.provide_q(q_rows=raw, vocab=vocab)
        item.q = torch.frombuffer(raw, dtype=torch.float32).view(-1, vocab)
        if guard is not None:
            if len(self._q_guards) > 4 * self.max_batch:  # answered rounds' (withdrawn, dropped): forgotten
                self._q_guards = {k: v for k, v in self._q_guards.items()
                                  if v[0].future is not None and not v[0].future.done()}
            self._q_guards[id(item)] = (item, guard)

    def _rows_moved(self, item: Round) -> bool:
        """Whether ``item``'s rows, read in place, were rewritten or freed since they were read."""
        guard = self._q_guards.get(id(item))
        return guard is not None and guard[0] is item and not guard[1]()

    def _rows_held(self, scored: list[tuple[Round, int, int]]) -> list[tuple[Round, int, int]]:
        """The scored rounds less those whose rows, read in place, were rewritten or freed
        before the kernels were done with them: those commit nothing and are answered
        sdcp-q-unavailable, whatever the kernels made of mixed bytes (§6.3). Whether rows
        changed does not depend on the round's draws, so dropping it biases nothing."""
        held = []
        for entry in scored:
            item = entry[0]
            guard = self._q_guards.pop(id(item), None)
            if guard is not None and guard[0] is item and not guard[1]():
                item.live.session.abandon()
                item.settle(QUnavailable("the draft rows were rewritten while they were read"))
                continue
            held.append(entry)
        return held

    def _owed(self) -> int:
        """Sessions whose drafter may send a proposal now, plus rounds fetching their rows."""
        owed = self._fetching
        for live in self.sessions.open_records():
            s = live.session
            if s.state is State.READY and s.drafter is not None and not s.revoked:
                owed += 1
        return owed

    def _survey(self) -> tuple[list[LiveSession], list[SessionNeed]]:
        """One walk over the sessions, in the order they were opened: self-decoding is started
        for those no drafter was assigned to for ``self_decode_idle``; the sessions the plan
        needs to know of (not yet prefilled, self-decoding or owing a proposal) and their needs."""
        lives: list[LiveSession] = []
        needs: list[SessionNeed] = []
        idle = self.self_decode_idle
        now = self.clock() if idle is not None else 0.0
        for live in self.sessions.open_records():
            s = live.session
            state = s.state
            if state is State.READY and s.drafter is None and self_decode_due(live.opened, now, idle):
                s.begin_self_decoding(load=self.load.percent())
                state = s.state
            self_decoding = state is State.SELF_DECODING
            owes = state is State.READY and s.drafter is not None and not s.revoked
            prefill = live.prefill
            if prefill.done and not self_decoding and not owes:
                continue  # nothing of it in the plan: its rounds come through the queue
            lives.append(live)
            needs.append(SessionNeed(id(live), len(s.prompt) + s.committed, prefill.fed, prefill.done,
                                     prefill.chunks_failed, state in _OPEN, self_decoding, owes))
        return lives, needs

    def _pending(self) -> bool:
        """``pending(self._survey()[1], ...)``, self-decoding started alike, without building
        the need of every session that owes a proposal: a prefilled session is pending only
        when it self-decodes. Asked before each idle wait, at hundreds of sessions."""
        idle = self.self_decode_idle
        now = self.clock() if idle is not None else 0.0
        found = False
        for live in self.sessions.open_records():
            s = live.session
            state = s.state
            if state is State.READY and s.drafter is None and self_decode_due(live.opened, now, idle):
                s.begin_self_decoding(load=self.load.percent())
                state = s.state
            if found:
                continue  # the walk goes on: every session due is started, as _survey does
            if state is State.SELF_DECODING:
                found = True
            elif not live.prefill.done:
                found = pending((_need(live),), self.prefill_chunk)
        return found

    def _compose(self) -> tuple[list[Round], list[tuple[LiveSession, int]], Plan]:
        """The next pass as planned: its rounds (queued ones, then self-decoded ones) and its
        prefill chunks ``(session, context end)``; the rounds it leaves stay queued in order."""
        lives, needs = self._survey()
        queue = self._queue
        limits = Limits(self.max_batch, self.prefill_chunk, self.prefill_solo, self.budget.value)
        planned = plan(needs, [Queued(_need(item.live), len(item.work.proposed)) for item in queue], limits,
                       fetching=self._fetching)
        taken = set(planned.rounds)
        batch = [queue[i] for i in planned.rounds]
        self._queue = [item for i, item in enumerate(queue) if i not in taken]
        batch += [Round(lives[i].session.self_decode(), live=lives[i]) for i in planned.self_decoded]
        self.load.prefill = planned.waiting
        return batch, [(lives[i], end) for i, end in planned.chunks], planned

    async def run(self) -> None:
        """Form and score batches until cancelled."""
        while True:
            if not self._queue and not self._pending():
                self.wake.clear()
                # Unassigned sessions are looked at again while self-decoding them is enabled.
                idle = None if self.self_decode_idle is None else max(0.05, self.self_decode_idle / 2)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.wake.wait(), idle)
            gathered = 0.0  # seconds this pass's batch waited for the proposals owed
            if self._queue:
                gathering = time.perf_counter()
                await self._gather()
                gathered = time.perf_counter() - gathering
            if (now := self.clock()) - self._retired >= 1.0:  # between passes: it changes the cache
                self._retired = now
                retire_ended(self.sessions, self.scorer.release, now)
            batch, chunks, planned = self._compose()
            if batch or chunks:
                try:
                    await self._pass(batch, chunks, planned, gathered)
                except Exception:  # a scorer or kernel failure: drop the rounds, keep serving
                    log.exception("scoring pass failed")
                    for item in batch:
                        _drop(item)
                    for live, _ in chunks:
                        # Not chunked again: its first round then feeds the rest in one pass, and a
                        # failure there is a dropped round, sent again by its drafter's back-off.
                        live.prefill.chunks_failed = True
                # Let readers and drafters run between passes, also while sessions self-decode: an
                # output read takes a few loop steps (a long-poll wake-up), so a few yields.
                for _ in range(4):
                    await asyncio.sleep(0)

    async def _gather(self) -> None:
        """Wait until no session owes a proposal, the batch is full, or ``batch_wait`` passed.
        The sessions are counted again once as many proposals as were owed came in, or on any
        other wake-up (an assignment, a session opened or cancelled), not on each proposal."""
        deadline = self.clock() + self.batch_wait
        while (owed := self._owed()) and len(self._queue) < self.max_batch:
            remaining = deadline - self.clock()
            if remaining <= 0:
                return
            self.wake.clear()
            self._expected = owed
            try:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(remaining):  # a timer, not wait_for's task per wake-up
                        await self.wake.wait()
            finally:
                self._expected = 0

    async def _pass(self, batch: list[Round], chunks: Sequence[tuple[LiveSession, int]], planned: Plan,
                    gathered: float = 0.0) -> None:
        """One scoring pass over ``batch`` and the prefill ``chunks`` (as ``planned``), then the
        rounds' commits in batch order; ``gathered``: the seconds its batch waited to close."""
        scoring = time.perf_counter()
        requests = [ScoreRequest(item.work.session, item.work.context, item.work.proposed) for item in batch]
        fed = [len(r.proposal) + (1 if item.live.prefill.done else _need(item.live).unfed)
               for item, r in zip(batch, requests, strict=True)]
        for live, end in chunks:
            requests.append(ScoreRequest(live.session.session, _context(live, end), ()))
            fed.append(end - live.prefill.fed)
        self.progress = started = self.clock()
        self.load.batch(len(batch), sum(fed))
        self.metrics.batch(len(batch) + len(chunks))  # sessions in the pass, those being prefilled too
        starting = [item.live for item in batch if not item.live.prefill.done] + [live for live, _ in chunks]
        for live in starting:
            need = _need(live)
            if live.prefill.started is None and need.unfed >= LONG_PREFILL:
                live.prefill.started = started
                how = "in one pass"
                if chunked(need, self.prefill_chunk):
                    how = f"in chunks of at most {self.prefill_chunk}"
                    if self.prefill_solo != self.prefill_chunk:
                        how += f", {self.prefill_solo or 'the rest'} when no round shares the pass"
                log.info("session %s: prefill of %d tokens starts (%s)", live.session.session.hex(), need.unfed, how)
        for live, _ in chunks:
            live.prefill.in_pass = True  # a cancel releases its cache only after this pass
        try:
            logits = await self.objects.call(self.scorer.score, requests)  # off the loop when offloaded
        finally:
            self.load.done()
            for live, _ in chunks:
                live.prefill.in_pass = False
        for live in starting:
            live.prefill.passes += 1
        for live, end in chunks:
            self.load.prefill = max(0, self.load.prefill - (end - live.prefill.fed))
            live.prefill.fed = end
        for item in batch:
            live, prefill = item.live, item.live.prefill
            if not prefill.done and prefill.started is not None:
                n = prefill.passes
                log.info("session %s: prefill of %d tokens done in %.2f s (%d pass%s)", live.session.session.hex(),
                         len(item.work.context), self.clock() - prefill.started, n, "" if n == 1 else "es")
            prefill.done = True
        took = self.clock() - started
        if planned.decoding:
            self._adapt(took, planned.prefill, held_back=planned.held_back, rounds=len(batch))
        if took >= LONG_PASS:
            log.warning("a scoring pass took %.1f s (%d rounds, %d tokens fed): sessions %s", took, len(batch),
                        sum(fed), ", ".join(r.session.hex() for r in requests))
        self.target_passes += 1
        # The rounds come first; prefill chunks after. A round whose rows changed under the
        # kernel is answered alone by _rows_held (its None result is never committed).
        results = verify_batch(batch, logits, backend=self.backend, moved=self._rows_moved if self._q_guards else None)
        # One group commit for the pass; each round answered by its own append's outcome.
        scored = [(item, *(result or (0, 0))) for item, result in zip(batch, results, strict=True)]
        if self._q_guards:
            scored = self._rows_held(scored)
        self.metrics.phase("gather", gathered)
        self.metrics.phase("score", time.perf_counter() - scoring)
        if any(await self.committer.commit_batch(scored, len(batch))):
            self.progress = self.clock()

    def _adapt(self, took: float, prefill: int, *, held_back: bool = False, rounds: int = 1) -> None:
        """Teach the shared budget a pass's time (:meth:`SharedBudget.adapt`)."""
        self.budget.adapt(took, prefill, held_back=held_back, rounds=rounds)


def default_prefill_chunk(scorer: object, *, solo: bool = False) -> int:
    """The chunk (``solo``: a pass's budget with no decoding round in it) for a scorer on its
    device (one without a ``device``: the CPU's)."""
    device = getattr(scorer, "device", None)
    on_cpu = device is None or torch.device(device).type == "cpu"
    if solo:
        return PREFILL_SOLO_CPU if on_cpu else PREFILL_SOLO_GPU
    return PREFILL_CHUNK_CPU if on_cpu else PREFILL_CHUNK_GPU


def _context(live: LiveSession, end: int) -> tuple[int, ...]:
    """The first ``end`` tokens of the session's prompt followed by its committed output."""
    s = live.session
    prompt = s.prompt
    if end <= len(prompt):
        return tuple(prompt[:end])
    return (*prompt, *s.output(0).tokens[: end - len(prompt)])


def _need(live: LiveSession) -> SessionNeed:
    """What the plan needs to know of ``live`` (whose round is queued, or that starts a prefill)."""
    s, prefill = live.session, live.prefill
    state = s.state
    return SessionNeed(id(live), len(s.prompt) + s.committed, prefill.fed, prefill.done, prefill.chunks_failed,
                       state in _OPEN, state is State.SELF_DECODING,
                       state is State.READY and s.drafter is not None and not s.revoked)


def _drop(item: Round) -> None:
    """A round the pass could not score: nothing committed; the drafter sends it again."""
    if item.live.session.state is State.SCORING:
        item.live.session.abandon()
    item.settle(InternalError("the round could not be scored"))  # a 5xx (§6.9)
