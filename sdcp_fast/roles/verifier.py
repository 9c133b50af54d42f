"""The verifier role (§6.1, §6.3–§6.8): sessions, continuous batching, scoring through the
kernels, the commit log, output, and status reports.

Resources (Table 1): ``POST sessions``, ``PUT sessions/{id}/drafter``, ``POST proposals``,
``GET sessions/{id}/output?from=n``, ``POST sessions/{id}/policy``. Every decision is the
core's (:class:`~sdcp_fast.protocol.VerifierSession`); this role fetches q rows, forms
batches, scores, appends, and answers.

Batching: a batch opens with the first waiting round and closes when every session that
owes a proposal has sent it, or ``batch_wait`` seconds later, whichever is first
(docs/interpretations.md, "Verifier batching"); sessions that are self-decoding join every
batch. One scoring pass covers the batch; rounds are committed in batch order.

Target KV pages (§6.3 "MAY publish", §6.9 ``resume.target_kv``): with a scorer that keeps a
paged cache, the committed prefix's KV is published to ``target_kv/<epoch>`` in the background
after a commit, whenever it has grown enough since the last publish (``kv_publish_tokens``,
``kv_publish_growth``); a resumed open whose ``resume.target_kv`` names such an object imports
it, so its first pass computes only the positions after it (docs/reliability.md, scenario 2).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch

from sdcp_fast.cache import ObjectUnavailable, object_uri
from sdcp_fast.commitlog import Fenced, PreconditionFailed, append_checked, open_commit_log
from sdcp_fast.model.interfaces import ScoreRequest, TargetKV, TargetScorer
from sdcp_fast.model.kv_transfer import target_kv_of
from sdcp_fast.protocol import (
    Assignment,
    BadRequest,
    Policy,
    Proposal,
    QUnavailable,
    SdcpProblem,
    SessionOpen,
    SessionState,
    StaleEpoch,
    Status,
    UnknownSession,
    Verdict,
    parse_session_path_id,
)
from sdcp_fast.protocol.commitlog import CommitRecord, classify_failed_append
from sdcp_fast.protocol.messages import ROLE_VERIFIER
from sdcp_fast.protocol.peer import Peer, PeerRole, require_role
from sdcp_fast.protocol.registry import SessionRegistry
from sdcp_fast.protocol.session import Pending, RoundDone, ScoreNeeded, State, VerifierSession
from sdcp_fast.roles.load import VerifierLoad
from sdcp_fast.roles.metrics import VerifierMetrics
from sdcp_fast.roles.objects import Objects, pack_tokens
from sdcp_fast.roles.scoring import Scored, verify_batch
from sdcp_fast.roles.wire import Busy, InternalError, Routes, SdcpClient, decode_body, report_status_forever
from sdcp_fast.transport.base import Request, Transport

log = logging.getLogger("sdcp_fast.verifier")


def tokens_object(session: VerifierSession) -> str | None:
    """Where this verifier writes the session's committed output: one object per epoch, so a
    fenced verifier's late write never touches its successor's (docs/interpretations.md)."""
    if session.contract.scope is None:
        return None
    return object_uri(session.contract.scope, session.session, "committed_tokens", session.epoch)


def kv_object(session: VerifierSession) -> str | None:
    """Where this verifier publishes the session's target KV pages: one object per epoch, as
    for ``committed_tokens`` (an object has one writer; a fenced verifier's late publish
    replaces only its own)."""
    if session.contract.scope is None:
        return None
    return object_uri(session.contract.scope, session.session, "target_kv", session.epoch)


@dataclass(frozen=True)
class RoundInfo:
    """One committed round, for observers (the demo's per-round lines, the bench)."""

    session: bytes
    round: int
    drafter: str | None  # None for a self-decoded round
    proposed: int
    accepted: int
    emitted: tuple[int, ...]
    action: Any
    m_cap: int
    digest: bytes
    batch: int  # sessions in the scoring pass


@dataclass
class _Live:
    """What the role keeps beside the core's session: its log and who waits on it."""

    session: VerifierSession
    log: Any
    etag: str
    tokens_ref: str | None
    opened: float = 0.0
    kv_ref: str | None = None
    # Committed length (prompt + output) when the last published pages were taken: they hold
    # all of it the cache had (not the last token, which no pass has fed to the model yet).
    kv_published: int = 0
    kv_busy: bool = False  # a publish is in flight (never two at once per session)
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    waiting: dict[int, asyncio.Future[Verdict]] = field(default_factory=dict)


@dataclass
class _Item(Scored):
    live: _Live | None = None
    future: asyncio.Future[Verdict] | None = None  # None for a self-decoded round
    drafter: str | None = None
    started: float = field(default_factory=time.perf_counter)  # for the verdict latency


class VerifierRole:
    def __init__(
        self,
        scorer: TargetScorer,
        *,
        uri: str,
        mlc: Any,
        transport: Transport,
        target_digest: bytes,
        router: str | None = None,
        backend: str = "auto",
        max_batch: int = 64,
        max_sessions: int = 4096,
        max_prompt: int = 1 << 17,
        batch_wait: float = 0.005,
        output_wait: float = 10.0,
        status_ttl_ms: int = 10_000,
        offload: bool = False,
        self_decode_idle: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        on_round: Callable[[RoundInfo], None] | None = None,
        target_kv: TargetKV | None | str = "auto",
        kv_publish_tokens: int = 32,
        kv_publish_growth: float = 0.25,
    ) -> None:
        self.scorer = scorer
        self.uri = uri
        self.router = router
        self.backend = backend
        self.max_batch = max_batch
        # Bounds a router cannot exceed (docs/security.md, "Limits"): sessions not yet ended
        # (a new one beyond it is 503 sdcp-busy: open it at another verifier) and prompt tokens.
        self.max_sessions = max_sessions
        self.max_prompt = max_prompt
        self.batch_wait = batch_wait
        self.output_wait = output_wait
        self.status_ttl_ms = status_ttl_ms
        self.target_digest = target_digest
        self.clock = clock
        self.on_round = on_round
        # Local policy (docs/interpretations.md): a session no drafter was assigned to for
        # this many seconds is decoded by the target itself, where its contract permits it.
        self.self_decode_idle = self_decode_idle
        self.client = SdcpClient(transport)
        # Offloaded, scoring and store calls leave the event loop, so that a service keeps
        # answering while a pass runs; in process they run inline.
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="verifier") if offload else None
        self.objects = Objects(mlc, self._executor)
        # Pages of the committed prefix (docs/reliability.md, scenario 2): "auto" takes them from a
        # scorer with a paged cache; None publishes and imports nothing.
        self.target_kv: TargetKV | None = target_kv_of(scorer, target_digest) if target_kv == "auto" else \
            target_kv  # type: ignore[assignment]
        # A publish whenever the published prefix would grow by max(tokens, growth x published):
        # bytes written stay within 1 / growth + 1 times the final object's (a geometric series)
        # while a fail-over recomputes at most about growth x n + tokens positions.
        self.kv_publish_tokens = kv_publish_tokens
        self.kv_publish_growth = kv_publish_growth
        # Encoding and storing pages run on a thread of their own: never in the way of a pass,
        # a verdict or an append (only the copy out of the cache shares the scoring thread).
        self._kv_executor = ThreadPoolExecutor(1, thread_name_prefix="verifier-kv") \
            if self.target_kv is not None else None
        self._kv_objects = Objects(mlc, self._kv_executor)
        self.mlc = mlc
        self.sessions = SessionRegistry()
        self.load = VerifierLoad(max_batch)
        self.target_passes = 0
        self.progress = clock()  # when a scoring pass last started or a round was committed
        self._live: dict[bytes, _Live] = {}
        self._queue: list[_Item] = []
        self._fetching = 0
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._background: set[asyncio.Task[Any]] = set()
        self.routes = Routes()
        self.metrics = VerifierMetrics.mount(self.routes)
        self.routes.add("POST", r"sessions", self._post_session)
        self.routes.add("PUT", r"sessions/(?P<sid>[^/]+)/drafter", self._put_drafter)
        self.routes.add("POST", r"proposals", self._post_proposal)
        self.routes.add("GET", r"sessions/(?P<sid>[^/]+)/output", self._get_output)
        self.routes.add("POST", r"sessions/(?P<sid>[^/]+)/policy", self._post_policy)

    @property
    def handler(self) -> Routes:
        return self.routes

    # -- life cycle -----------------------------------------------------------------------

    async def start(self) -> None:
        self._tasks.append(asyncio.create_task(self._batcher(), name="verifier-batcher"))
        if self.router is not None:
            self._tasks.append(asyncio.create_task(self._report_status(), name="verifier-status"))

    async def close(self) -> None:
        for task in [*self._tasks, *self._background]:
            task.cancel()
        for task in [*self._tasks, *self._background]:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()
        for live in self._live.values():
            self.scorer.release(live.session.session)
            for future in live.waiting.values():
                if not future.done():
                    future.cancel()
        for executor in (self._executor, self._kv_executor):
            if executor is not None:
                executor.shutdown(wait=False)

    def status(self) -> Status:
        self.load.queue = len(self._queue) + self._fetching
        return Status(instance=self.uri, role=ROLE_VERIFIER, load=self.load.percent(), queue=self.load.queue,
                      ttl_ms=self.status_ttl_ms)

    async def report_status(self) -> None:
        if self.router is not None:
            await self.client.status(self.router, self.status())

    async def _report_status(self) -> None:
        await report_status_forever(self.report_status, self.status_ttl_ms, self.router)

    # -- resources ------------------------------------------------------------------------

    def _get(self, sid: str | bytes) -> _Live:
        session = parse_session_path_id(sid) if isinstance(sid, str) else sid
        core = self.sessions.get(session)
        live = self._live.get(session)
        if live is None or live.session is not core:
            raise UnknownSession("no such session at this verifier")
        return live

    async def _post_session(self, request: Request) -> SessionState:
        require_role(request.peer, PeerRole.ROUTER)
        message = decode_body(SessionOpen, request)
        if request.peer is not None and message.commit_log.startswith("file://"):
            # A path on this verifier's own file system is not a remote peer's to name.
            raise BadRequest("commit_log: a file:// log may be named only by an in-process caller")
        if message.session not in self.sessions and self._open_sessions() >= self.max_sessions:
            raise Busy(f"{self.max_sessions} sessions are open at this verifier")
        prompt = None
        committed: Sequence[int] = ()
        try:
            if isinstance(message.prompt, str):
                prompt = await self.objects.tokens(message.prompt)
            if message.resume is not None:
                # The object may run ahead of the log (it is written before each append): the
                # resumed prefix is what the last commit record names; the core checks its digest.
                committed = (await self.objects.tokens(message.resume.committed_tokens))[:message.resume.committed]
        except ObjectUnavailable as exc:
            raise BadRequest(f"a referenced object could not be read: {exc}") from None
        if len(prompt if prompt is not None else message.prompt) > self.max_prompt:
            raise BadRequest(f"the prompt is over {self.max_prompt} tokens")
        session, state = self.sessions.open(message, target_digest=self.target_digest,
                                            vocab=self.scorer.vocab_size, prompt_tokens=prompt,
                                            committed_tokens=committed)
        live = self._live.get(message.session)
        if live is None or live.session is not session:
            if live is not None:  # re-opened at a higher epoch (§6.9): the old one is over
                self._fail_waiting(live, StaleEpoch("the session was re-opened at a newer epoch"))
            try:
                log_ = await self.objects.call(open_commit_log, message.commit_log, mlc=self.mlc)
                view = await self.objects.call(log_.read)
            except ValueError as exc:  # a name no backend serves: the router's mistake, not ours
                raise BadRequest(f"commit_log cannot be opened: {exc}") from None
            live = _Live(session, log_, view.etag, tokens_object(session), self.clock(), kv_ref=kv_object(session))
            # Served from now on: the router names this verifier before the open returns, and an
            # output reader must not find the session unknown (it would fail it over again). No
            # round can be scored before the open returns: nobody is assigned to it yet.
            self._live[message.session] = live
            if live.tokens_ref is not None and session.committed:
                try:
                    # A resumed session's output, in this epoch's object before anyone is assigned to it.
                    await self.objects.put(live.tokens_ref, pack_tokens(session.output(0).tokens))
                except BaseException:  # not opened after all: the router's retry writes it again
                    if self._live.get(message.session) is live:
                        del self._live[message.session]
                    raise
            if message.resume is not None:
                await self._resume_kv(live, message.resume.target_kv)
            self._wake.set()
        return state

    async def _resume_kv(self, live: _Live, ref: str | None) -> None:
        """Import the pages a resume names, before any pass of the session; whatever goes wrong
        (none named, unreadable, another model's, other tokens) leaves a cold prefill to the
        first pass, which is always correct, and is counted by reason."""
        session = live.session
        if self.target_kv is None:
            self.metrics.resume("cold", "unsupported")
            return
        if ref is None:
            self.metrics.resume("cold", "none")
            return
        committed = (*session.prompt, *session.output(0).tokens)
        kv = self.target_kv

        def load(data: Any) -> int:  # parsing is cheap (the values are not copied): one hop, not two
            return kv.import_kv(session.session, kv.decode_kv(data), committed)

        try:
            # On the time to first token: where scoring runs, not on the publishing thread.
            n = await self.objects.call(load, await self.objects.get(ref))
        except ValueError as exc:
            log.warning("session %s: target KV %s refused: %s", session.session.hex()[:8], ref, exc)
            self.metrics.resume("cold", "refused")
            return
        except Exception as exc:  # missing, evicted, the MLC unreachable: compute instead
            log.warning("session %s: target KV %s unavailable: %s", session.session.hex()[:8], ref, exc)
            self.metrics.resume("cold", "unavailable")
            return
        self.metrics.resume("pages" if n else "cold", "" if n else "refused", positions=n)

    def _maybe_publish_kv(self, live: _Live) -> None:
        session = live.session
        if self.target_kv is None or live.kv_ref is None or live.kv_busy:
            return
        if session.state in (State.FINISHED, State.FAILED):
            # Nobody resumes an ended session: its pages only take room in the MLC. (A fenced
            # one's stay: if its successor dies before publishing, the next resume uses them.)
            if live.kv_published:
                live.kv_published = 0
                self._spawn(self._drop_kv(live.kv_ref))
            return
        if session.closed:
            return
        grown = len(session.prompt) + session.committed - live.kv_published
        if grown < max(self.kv_publish_tokens, int(live.kv_published * self.kv_publish_growth)):
            return
        live.kv_busy = True
        self._spawn(self._publish_kv(live))

    async def _publish_kv(self, live: _Live) -> None:
        """Copy the committed prefix out of the cache (between passes), encode and store it
        (off the event loop and the scoring thread). A failure is logged and counted: a later
        fail-over then recomputes more, nothing else changes."""
        assert self.target_kv is not None and live.kv_ref is not None
        session = live.session
        done = False
        try:
            committed = (*session.prompt, *session.output(0).tokens)
            pages = await self.objects.call(self.target_kv.export_kv, session.session, committed)
            if pages is None:
                return
            data = await self._kv_objects.call(self.target_kv.encode_kv, pages)
            await self._kv_objects.put(live.kv_ref, data)
            live.kv_published = len(committed)
            self.metrics.kv_published(len(data))
            done = True
        except Exception as exc:
            log.warning("session %s: target KV not published to %s: %s", session.session.hex()[:8], live.kv_ref, exc)
            self.metrics.kv_publish_failed()
        finally:
            live.kv_busy = False
        if done:  # rounds committed meanwhile were skipped (one publish at a time): catch up now
            self._maybe_publish_kv(live)

    async def _drop_kv(self, ref: str) -> None:
        try:
            await self._kv_objects.delete(ref)
        except Exception as exc:  # evicted already, or the MLC away: LRU reclaims it in time
            log.info("target KV %s not deleted: %s", ref, exc)

    def _open_sessions(self) -> int:
        ended = (State.FINISHED, State.FAILED, State.FENCED)
        return sum(1 for live in self._live.values() if live.session.state not in ended)

    async def _put_drafter(self, request: Request, sid: str) -> SessionState:
        require_role(request.peer, PeerRole.ROUTER)
        live = self._get(sid)
        assignment = decode_body(Assignment, request)
        if assignment.session != live.session.session:
            raise BadRequest("assignment is for another session than its path")
        state = live.session.assign(assignment)
        self._wake.set()
        return state

    async def _post_policy(self, request: Request, sid: str) -> SessionState:
        require_role(request.peer, PeerRole.ROUTER)
        live = self._get(sid)
        policy = decode_body(Policy, request)
        if policy.session != live.session.session:
            raise BadRequest("policy is for another session than its path")
        return live.session.policy(policy)

    async def _get_output(self, request: Request, sid: str) -> Any:
        live = self._get(sid)
        raw = request.query.get("from", "0")
        if not raw.isdigit():
            raise BadRequest("from must be a uint")
        start = int(raw)
        deadline = self.clock() + self.output_wait
        while True:
            out = live.session.output(start)
            remaining = deadline - self.clock()
            if out.tokens or out.final or remaining <= 0:
                return out
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(live.changed.wait(), remaining)

    async def _post_proposal(self, request: Request) -> Verdict:
        peer = request.peer
        if peer is not None:  # a certificate without the drafter role proposes for no session
            require_role(peer, PeerRole.DRAFTER)
        proposal = decode_body(Proposal, request)
        live = self._get(proposal.session)
        client: Peer | str = peer if peer is not None else ""
        while True:
            work = live.session.receive_proposal(proposal, client=client, now=self.clock())
            if isinstance(work, Verdict):
                return work
            if not isinstance(work, Pending):
                break
            # An identical request is being verified: its verdict answers this one too (§6.3).
            waiter = live.waiting.get(work.round)
            if waiter is None:
                await asyncio.sleep(0)
            else:
                with contextlib.suppress(SdcpProblem, asyncio.CancelledError):
                    await asyncio.shield(waiter)
        item = _Item(work, live=live, future=asyncio.get_running_loop().create_future(),
                     drafter=live.session.drafter)
        assert item.future is not None
        live.waiting[work.round] = item.future  # before the rows are fetched: retries wait on it
        if work.needs_q:
            try:
                await self._fetch_q(item, proposal)
            except BaseException:
                live.waiting.pop(work.round, None)
                raise
        self._queue.append(item)
        self._wake.set()
        try:
            return await asyncio.shield(item.future)
        finally:
            if live.waiting.get(work.round) is item.future and item.future.done():
                del live.waiting[work.round]

    async def _fetch_q(self, item: _Item, proposal: Proposal) -> None:
        """Rule 2's precondition: the rows of every position, checked, before any random value."""
        live = item.live
        assert live is not None
        vocab = self.scorer.vocab_size
        self._fetching += 1
        try:
            raw = await self.objects.get(proposal.q_rows) if proposal.q_rows else None
        except (ObjectUnavailable, OSError, ValueError):
            raw = None  # the core answers sdcp-q-unavailable and commits nothing (§6.3)
        except SdcpProblem:
            raw = None
        finally:
            self._fetching -= 1
        self.metrics.q_read(raw is not None)
        if raw is not None and len(raw) != 4 * vocab * len(proposal.tokens):
            live.session.provide_q(q_rows=None, vocab=vocab)  # raises QUnavailable, round dropped
            raise QUnavailable("draft rows object has the wrong size")  # pragma: no cover
        uniforms = live.session.provide_q(q_rows=raw, vocab=vocab)
        assert raw is not None
        item.q = torch.frombuffer(raw, dtype=torch.float32).view(-1, vocab)
        item.work = ScoreNeeded(**{**item.work.__dict__, "uniforms": uniforms})

    # -- batching -------------------------------------------------------------------------

    def _owed(self) -> int:
        """Sessions whose drafter may send a proposal now, plus rounds fetching their rows."""
        owed = self._fetching
        for live in self._live.values():
            s = live.session
            if s.state is State.READY and s.drafter is not None and not s.revoked:
                owed += 1
        return owed

    def _self_decoding(self) -> list[_Live]:
        if self.self_decode_idle is not None:
            now = self.clock()
            for live in self._live.values():
                s = live.session
                if s.state is State.READY and s.drafter is None and now - live.opened >= self.self_decode_idle:
                    s.begin_self_decoding(load=self.load.percent())
        return [live for live in self._live.values() if live.session.state is State.SELF_DECODING]

    async def _batcher(self) -> None:
        while True:
            if not self._queue and not self._self_decoding():
                self._wake.clear()
                # Unassigned sessions are looked at again while self-decoding them is enabled.
                idle = None if self.self_decode_idle is None else max(0.05, self.self_decode_idle / 2)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), idle)
            if self._queue:
                deadline = self.clock() + self.batch_wait
                while self._owed() and len(self._queue) < self.max_batch:
                    remaining = deadline - self.clock()
                    if remaining <= 0:
                        break
                    self._wake.clear()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._wake.wait(), remaining)
            batch = self._queue[: self.max_batch]
            del self._queue[: len(batch)]
            for live in self._self_decoding():
                if len(batch) >= self.max_batch:
                    break
                batch.append(_Item(live.session.self_decode(), live=live))
            if batch:
                try:
                    await self._run_batch(batch)
                except Exception as exc:  # a scorer or kernel failure: drop the rounds, keep serving
                    log.exception("scoring pass failed")
                    for item in batch:
                        self._drop(item, exc)
                # Let readers and drafters run between passes, also while sessions self-decode: an
                # output read takes a few loop steps (a long-poll wake-up), so a few yields.
                for _ in range(4):
                    await asyncio.sleep(0)

    def _drop(self, item: _Item, exc: BaseException) -> None:
        live = item.live
        assert live is not None
        if live.session.state is State.SCORING:
            live.session.abandon()
        if item.future is not None and not item.future.done():
            # A server-side failure (5xx): the drafter sends the proposal again (§6.9).
            item.future.set_exception(InternalError("the round could not be scored"))

    async def _run_batch(self, batch: list[_Item]) -> None:
        requests = [ScoreRequest(item.work.session, item.work.context, item.work.proposed) for item in batch]
        self.progress = self.clock()
        self.load.batch(len(batch))
        self.metrics.batch(len(batch))
        logits = await self.objects.call(self.scorer.score, requests) if self._executor else \
            self.scorer.score(requests)
        self.target_passes += 1
        results = verify_batch(batch, logits, backend=self.backend)
        for item, (accepted, token) in zip(batch, results, strict=True):
            try:
                await self._commit(item, accepted, token, len(batch))
            except Exception as exc:  # one session's trouble (e.g. re-opened meanwhile) is not the batch's
                log.warning("session %s: round not committed: %s", item.work.session.hex()[:8], exc)
                assert item.live is not None
                if item.live.session.state is State.COMMITTING:  # never left half-done (see _commit)
                    item.live.session.append_done(ok=False)
                self._settle(item, InternalError("the round could not be committed"))
        if self._self_decoding():
            self._wake.set()

    # -- commit ---------------------------------------------------------------------------

    async def _commit(self, item: _Item, accepted: int, token: int, batch: int) -> None:
        live = item.live
        assert live is not None
        session = live.session
        append = session.complete_scoring(accepted, token, load=self.load.percent())
        if live.tokens_ref is not None:
            # Before the record: the object never lags the log, so a fail-over can resume from
            # it (§6.9) and a drafter learn from it; readers take the prefix they were told.
            try:
                await self.objects.put(live.tokens_ref,
                                       pack_tokens((*session.output(0).tokens, *append.record.emitted)))
            except Exception as exc:
                log.warning("session %s: could not write %s: %s", item.work.session.hex()[:8], live.tokens_ref, exc)
        try:
            etag = await self.objects.call(append_checked, live.log, append.record, live.etag)
        except Fenced:
            etag = None
        except Exception as exc:  # a 412, or no answer: the log read again says what happened (§6.8)
            try:
                if not isinstance(exc, PreconditionFailed):
                    log.warning("session %s: commit-log append failed: %s", item.work.session.hex()[:8], exc)
                    if str((await self.objects.call(live.log.read)).etag) == str(live.etag):
                        raise ConnectionError("the log is as we left it: nothing was appended")
                etag = await self._after_failed_append(live, append.record)
            except Exception:
                # Nothing is known to be appended: release nothing (§6.3), and leave the round so
                # that the drafter's retry (a 5xx) scores it again; if the record did land, that
                # retry's append gets a 412 and the log read then says "committed". (A 412 whose
                # read failed too, the MLC restarting, once left the round half-done: every retry
                # was "pending" and no append was tried again.)
                session.append_done(ok=False)
                self._settle(item, InternalError("the commit log could not be appended"))
                return
        if etag is None:  # a newer epoch owns the log: discard, stop serving (§6.3, §6.8)
            session.append_done(ok=False, fenced=True)
            self._fail_waiting(live, StaleEpoch("the commit log was fenced by a newer epoch"))
            self._settle(item, StaleEpoch("the commit log was fenced by a newer epoch"))
            return
        live.etag = etag
        self.progress = self.clock()
        done = session.append_done(ok=True)
        assert isinstance(done, RoundDone)
        self._settle(item, done.verdict)
        live.changed.set()
        live.changed = asyncio.Event()
        for event in done.events:
            self._spawn(self._send_event(event))
        self._maybe_publish_kv(live)
        self.metrics.round(done.verdict, len(item.work.proposed), item.started if item.future else None)
        if self.on_round is not None:
            v = done.verdict
            self.on_round(RoundInfo(session=v.session, round=v.round, drafter=item.drafter if item.future else None,
                                    proposed=len(item.work.proposed), accepted=v.accepted, emitted=v.emitted,
                                    action=v.action, m_cap=v.m_cap, digest=v.digest, batch=batch))

    async def _after_failed_append(self, live: _Live, own: CommitRecord) -> str | None:
        """A 412 (§6.8): the log read again decides (``classify_failed_append``): our record
        already there means only the answer was lost; a fence or another writer means the
        session is no longer ours (None)."""
        view = await self.objects.call(live.log.read)
        if classify_failed_append(view.records, own) == "committed":
            return str(view.etag)
        return None

    def _settle(self, item: _Item, outcome: Verdict | SdcpProblem) -> None:
        future = item.future
        if future is not None and item.live is not None and item.live.waiting.get(item.work.round) is future:
            del item.live.waiting[item.work.round]  # a recorded verdict answers any later retry
        if future is None or future.done():
            return
        if isinstance(outcome, Verdict):
            future.set_result(outcome)
        else:
            future.set_exception(outcome)

    def _fail_waiting(self, live: _Live, problem: SdcpProblem) -> None:
        live.changed.set()
        for future in live.waiting.values():
            if not future.done():
                future.set_exception(problem)

    async def _send_event(self, event: Any) -> None:
        if self.router is None:
            return
        for attempt in range(5):
            try:
                await self.client.event(self.router, event)
                return
            except SdcpProblem as problem:
                if problem.status < 500:
                    log.warning("session %s: router refused event: %s", event.session.hex()[:8], problem.detail)
                    return
            except Exception as exc:
                log.warning("session %s: event to %s failed: %s", event.session.hex()[:8], self.router, exc)
            await asyncio.sleep(0.05 * 2 ** attempt)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
