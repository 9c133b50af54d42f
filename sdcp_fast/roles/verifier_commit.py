"""The verifier's commits (§6.3 Commit, §6.8): a scored round's record appended to the
session's commit log, then the verdict, the released tokens and the events.

Nothing is released before the append: a failed append leaves the round to the drafter's
retry, and a fenced one ends this verifier's service of the session. The records of one
scoring pass are appended together (:meth:`Committer.commit_batch`, the store's group commit),
each round then answered by its own append's outcome, a few dozen at a time with the event
loop running between, so that the first verdicts leave while the rest are released. A round
that ends its session waits for the session's output object off the pass.

The ``committed_tokens`` object is not rewritten each round (that would write bytes that grow
with the session's length, every round): the log holds every emitted token, and the object is
written when a reader will need it (docs/interpretations.md, "MLC objects"): when a drafter
is assigned mid-session, before a problem that tells a drafter the session's state, and when
the session ends here. A resumed open reads its prefix from the log (:func:`output_of_log`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Sequence

from sdcp_fast.cache import object_uri
from sdcp_fast.cache.uri import writer_tag
from sdcp_fast.commitlog import Fenced, PreconditionFailed
from sdcp_fast.protocol import Event, SdcpProblem, StaleEpoch, Verdict
from sdcp_fast.protocol.commitlog import CommitRecord, LogRecord, classify_failed_append, writer_conflict
from sdcp_fast.protocol.problems import InternalError
from sdcp_fast.protocol.session import RoundDone, State, VerifierSession
from sdcp_fast.roles.objects import pack_tokens
from sdcp_fast.roles.retry import retrying
from sdcp_fast.roles.verifier_config import VerifierConfig, VerifierContext
from sdcp_fast.roles.verifier_kv import KvPublisher, kv_object
from sdcp_fast.roles.verifier_state import KvPages, LiveSession, Round, RoundInfo, SessionLog
from sdcp_fast.roles.wire import SdcpClient, routers_of
from sdcp_fast.store.interface import LogAppend

log = logging.getLogger("sdcp_fast.verifier")

EVENT_ATTEMPTS = 5
# A pass's rounds are released this many at a time, the event loop running between: their
# verdicts leave (the native server sends what a loop iteration queued) while the rest are
# released, and their drafters, on other cores, draft meanwhile instead of waiting for the
# whole pass (docs/measurements.md, "Verdicts as they are released").
RELEASE_STEP = 32


def tokens_object(session: VerifierSession, writer: str = "") -> str | None:
    """Where this verifier writes the session's committed output: one object per epoch, so a
    fenced verifier's late write never touches its successor's (docs/interpretations.md), and
    named for ``writer`` (this verifier's base URI: its tag), so no other verifier can create
    it first (docs/security.md, "Names nobody can squat")."""
    if session.contract.scope is None:
        return None
    return object_uri(session.contract.scope, session.session, "committed_tokens", session.epoch,
                      tag=writer_tag(writer) if writer else None)


def output_of_log(records: Iterable[LogRecord]) -> list[int]:
    """The committed output the commit records hold: each record's ``emitted`` ends at its
    ``committed`` (a resumed epoch's records continue the prefix its predecessor committed)."""
    tokens: list[int] = []
    for record in records:
        if isinstance(record, CommitRecord):
            del tokens[max(0, record.committed - len(record.emitted)):]
            tokens.extend(record.emitted)
    return tokens


class Committer:
    def __init__(self, config: VerifierConfig, context: VerifierContext, *, kv: KvPublisher, client: SdcpClient,
                 on_round: Callable[[RoundInfo], None] | None = None) -> None:
        self.uri = config.uri  # it names the committed_tokens objects (tokens_object)
        self.router = config.router
        self.objects = context.objects
        self.store = context.store
        self.load = context.load
        self.metrics = context.metrics
        self.background = context.background
        self.clock = context.clock
        self.kv = kv
        self.client = client
        self.on_round = on_round

    async def open(self, session: VerifierSession, commit_log: str) -> LiveSession:
        """The record of a session opened at this epoch, with its log read (ValueError: no
        backend serves ``commit_log``; StaleEpoch: the log has moved past where the session
        starts, so its next round could not follow the log's last record, §6.8)."""
        log_ = await self.store.commit_log(commit_log)
        view = await log_.read()
        # The tag taken from this same read conditions the first append, so nothing written
        # after the check can be followed either.
        conflict = writer_conflict(view.records, epoch=session.epoch, round=session.round,
                                   committed=session.committed, digest=session.digest)
        if conflict is not None:
            log.warning("session %s: not opened at epoch %d: %s", session.session.hex(), session.epoch, conflict)
            raise StaleEpoch(conflict)
        return LiveSession(session, SessionLog(log_, view.etag, tokens_object(session, self.uri)), self.clock(),
                           kv=KvPages(kv_object(session, self.uri)))

    async def write_output(self, live: LiveSession, tokens: Sequence[int]) -> None:
        """The session's committed output, in this epoch's object."""
        assert live.log.tokens_ref is not None
        await self.objects.put(live.log.tokens_ref, pack_tokens(tokens))

    async def output_in_log(self, commit_log: str) -> list[int]:
        """The committed output the log named ``commit_log`` holds ([] if it cannot be read)."""
        try:
            log_ = await self.store.commit_log(commit_log)
            return output_of_log((await log_.read()).records)
        except Exception as exc:
            log.warning("commit log %s could not be read for a resume: %s", commit_log, exc)
            return []

    async def publish_output(self, live: LiveSession) -> None:
        """This epoch's object brought up to the committed output, for a reader about to need
        it; a failure is logged (the reader then retries, or a fail-over reads the log)."""
        if live.log.tokens_ref is None:
            return
        try:
            await self.write_output(live, live.session.output(0).tokens)
        except Exception as exc:
            log.warning("session %s: could not write %s: %s", live.session.session.hex(), live.log.tokens_ref, exc)

    async def commit_batch(self, scored: Sequence[tuple[Round, int, int]], batch: int) -> list[bool]:
        """Commit the rounds of one scoring pass (``(round, accepted, token)`` each): their
        records appended with one store call (group commit: one request and one flush for the
        records on the store's own logs), then each round answered by its own append, in
        batch order. Nothing of a pass is released before the call returns, so every released
        round's record is durable. Whether each round's record was appended; one round's
        trouble (a fence, another writer, a failure) is not the others'."""
        done = [False] * len(scored)
        started = time.perf_counter()
        pending: list[tuple[int, Round, CommitRecord]] = []
        load = self.load.percent()  # the same for every round of the pass
        for k, (item, accepted, token) in enumerate(scored):
            try:
                append = item.live.session.complete_scoring(accepted, token, load=load)
            except Exception as exc:
                _not_committed(item, exc)
                continue
            pending.append((k, item, append.record))
        if not pending:
            self._phases(started, time.perf_counter())
            return done
        entries = [LogAppend(item.live.log.handle, record, item.live.log.etag) for _, item, record in pending]
        appending = time.perf_counter()
        try:
            results = await self.store.append_batch(entries)
        except Exception as exc:  # the store did not answer for any of them: each as unanswered
            results = [exc] * len(entries)
        appended = time.perf_counter()
        # A failed append's log is read back to learn what happened: those reads go together,
        # so a pass whose appends got no answer waits for one read's timeout, not one each.
        failed = [i for i, result in enumerate(results) if not isinstance(result, str)]
        outcomes: list[str | None | BaseException] = []
        outcomes.extend(results)
        counted: list[tuple[Verdict, int, float | None]] = []  # the pass's rounds, for the metrics at once
        ending: list[tuple[Round, RoundDone]] = []  # rounds that end their session: released once published
        if failed:
            read = await asyncio.gather(*(self._outcome(pending[i][1].live, pending[i][2], results[i])
                                          for i in failed), return_exceptions=True)
            for i, outcome in zip(failed, read, strict=True):
                outcomes[i] = outcome
        for n, ((k, item, _), outcome) in enumerate(zip(pending, outcomes, strict=True)):
            if n and not n % RELEASE_STEP:
                await asyncio.sleep(0)
            try:
                if not isinstance(outcome, str):
                    await self._not_appended(item, outcome)
                    continue
                # Appended (the common case, answered without a coroutine per round).
                live, session = item.live, item.live.session
                live.log.etag = outcome
                round_done = session.append_done(ok=True)
                assert isinstance(round_done, RoundDone)
                if session.state in (State.FINISHED, State.FAILED):
                    ending.append((item, round_done))  # counted as it is released
                else:
                    counted.append(self._released(item, round_done, batch))
                done[k] = True
            except Exception as exc:  # e.g. the session re-opened meanwhile
                _not_committed(item, exc)
        self.metrics.pass_committed(counted)
        self._phases(started, appending, appended)
        if ending:
            self.background.spawn(self._release_ending(ending, batch))
        return done

    async def _release_ending(self, ending: Sequence[tuple[Round, RoundDone]], batch: int) -> None:
        """The rounds that ended their sessions, each released once its session's whole output
        is in this epoch's object (before anyone is told it ended), the objects written together.
        Off the pass: the other sessions' verdicts and the next pass never wait for these writes
        (at 64 sessions one or two end in most passes, each write an MLC round trip)."""
        await asyncio.gather(*(self.publish_output(item.live) for item, _ in ending))
        counted: list[tuple[Verdict, int, float | None]] = []
        for item, round_done in ending:
            try:
                counted.append(self._released(item, round_done, batch))
            except Exception as exc:  # as in the pass (commit_batch)
                _not_committed(item, exc)
        self.metrics.pass_committed(counted)

    def _released(self, item: Round, done: RoundDone, batch: int) -> tuple[Verdict, int, float | None]:
        """:meth:`_release`, then what the metrics count of the round: its verdict, its proposal's
        length and its latency as released (None for a self-decoded round)."""
        self._release(item, done, batch)
        return done.verdict, len(item.work.proposed), time.perf_counter() - item.started if item.future else None

    def _phases(self, started: float, appending: float, appended: float | None = None) -> None:
        """A pass's commit (``started`` to ``appending``), append (to ``appended``) and release
        (to now) phases; a pass with nothing to append spends no time in the last two."""
        now = time.perf_counter()
        self.metrics.phase("commit", appending - started)
        self.metrics.phase("append", 0.0 if appended is None else appended - appending)
        self.metrics.phase("release", 0.0 if appended is None else now - appended)

    async def _not_appended(self, item: Round, etag: None | BaseException) -> None:
        """The round whose record is not appended: None when a newer epoch or another writer
        owns the log, or why nothing is known to be appended."""
        live, session = item.live, item.live.session
        if isinstance(etag, BaseException):
            # Nothing is known to be appended: release nothing (§6.3), and leave the round so
            # that the drafter's retry (a 5xx) scores it again; if the record did land, that
            # retry's append gets a 412 and the log read then says "committed". (A 412 whose
            # read failed too, the MLC restarting, once left the round half-done: every retry
            # was "pending" and no append was tried again.)
            session.append_done(ok=False)
            item.settle(InternalError("the commit log could not be appended"))
            return
        # A newer epoch owns the log: discard, stop serving (§6.3, §6.8).
        await self.publish_output(live)  # what this epoch committed, for its readers
        session.append_done(ok=False, fenced=True)
        live.fail_waiting(StaleEpoch("the commit log was fenced by a newer epoch"))
        item.settle(StaleEpoch("the commit log was fenced by a newer epoch"))

    async def _outcome(self, live: LiveSession, record: CommitRecord, result: str | Exception) -> str | None:
        """The log's new etag; None if a fence or another writer owns the log now; raises if
        nothing is known to be appended."""
        if isinstance(result, str):
            return result
        if isinstance(result, Fenced):
            return None
        if not isinstance(result, PreconditionFailed):  # no answer: the log read again says what happened (§6.8)
            log.warning("session %s: commit-log append failed: %s", live.session.session.hex(), result)
            if str((await live.log.handle.read()).etag) == str(live.log.etag):
                raise ConnectionError("the log is as we left it: nothing was appended") from result
        # A 412 (§6.8): our record already there means only the answer was lost; a fence or
        # another writer means the session is no longer ours.
        view = await live.log.handle.read()
        if classify_failed_append(view.records, record) == "committed":
            return str(view.etag)
        return None

    def _release(self, item: Round, done: RoundDone, batch: int) -> None:
        """After the append: the verdict, the output readers, the router, the observers (the
        metrics count the pass's rounds together, in :meth:`commit_batch`)."""
        live, verdict = item.live, done.verdict
        item.settle(verdict)
        live.waiters.notify()
        for event in done.events:
            self.background.spawn(self.send_event(event))
        self.kv.after_commit(live)
        if self.on_round is not None:
            self.on_round(RoundInfo(
                session=verdict.session, round=verdict.round, drafter=item.drafter if item.future else None,
                proposed=len(item.work.proposed), accepted=verdict.accepted, emitted=verdict.emitted,
                action=verdict.action, m_cap=verdict.m_cap, digest=verdict.digest, batch=batch))

    async def send_event(self, event: Event) -> None:
        """Tell the router (§6.5), each of them when there are several (roles/wire.py
        ``routers_of``: the one routing the session acts on it); no answer or a 5xx is tried
        again, a 4xx is final."""
        await asyncio.gather(*(self._send_event(router, event) for router in routers_of(self.router)))

    async def _send_event(self, router: str, event: Event) -> None:
        sid = event.session.hex()

        def failed(_attempt: int, exc: BaseException) -> None:
            log.warning("session %s: event to %s failed: %s", sid, router, exc)

        try:
            await retrying(lambda _: self.client.event(router, event), attempts=EVENT_ATTEMPTS,
                           transient=_not_refused, on_retry=failed)
        except SdcpProblem as problem:
            if problem.status < 500:
                log.warning("session %s: router refused event: %s", sid, problem.detail)
            else:
                failed(EVENT_ATTEMPTS - 1, problem)
        except Exception as exc:
            failed(EVENT_ATTEMPTS - 1, exc)


def _not_committed(item: Round, exc: Exception) -> None:
    """A round whose commit step failed outright: never left half-done, answered with a 5xx
    (the drafter sends it again)."""
    log.warning("session %s: round not committed: %s", item.work.session.hex(), exc)
    if item.live.session.state is State.COMMITTING:
        item.live.session.append_done(ok=False)
    item.settle(InternalError("the round could not be committed"))


def _not_refused(exc: BaseException) -> bool:
    """Any failure but the router's 4xx may pass (it restarts, or is not reachable yet)."""
    return not (isinstance(exc, SdcpProblem) and exc.status < 500)
