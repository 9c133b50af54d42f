"""What the verifier role keeps beside the core's sessions: per session (its commit log, its
published KV pages, its prefill's progress, its output readers and waiting drafters: a record
each), per round in a batch, and the background tasks of its parts.

A :class:`LiveSession` is attached to its core session in the
:class:`~sdcp_fast.protocol.registry.SessionRegistry`: that one table says which sessions
the verifier serves.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

from sdcp_fast.protocol import Action, SdcpProblem, Verdict
from sdcp_fast.protocol.registry import SessionRegistry
from sdcp_fast.protocol.session import VerifierSession
from sdcp_fast.roles.scoring import Scored
from sdcp_fast.store.interface import Log

T = TypeVar("T")


@dataclass(frozen=True)
class RoundInfo:
    """One committed round, for observers (the demo's per-round lines, the bench)."""

    session: bytes
    round: int
    drafter: str | None  # None for a self-decoded round
    proposed: int
    accepted: int
    emitted: tuple[int, ...]
    action: Action
    m_cap: int
    digest: bytes
    batch: int  # sessions in the scoring pass


@dataclass(slots=True)
class SessionLog:
    """Where a session's commits go: its commit log and its committed output's object."""

    handle: Log
    etag: str  # of the log as this verifier last appended to or read it
    tokens_ref: str | None  # where its committed output is written (None: nowhere)


@dataclass(slots=True)
class KvPages:
    """A session's published target KV pages (roles/verifier_kv.py)."""

    ref: str | None = None  # where they are published (None: nowhere)
    # Committed length (prompt + output) when the last published pages were taken: they hold
    # all of it the cache had (not the last token, which no pass has fed to the model yet).
    published: int = 0
    busy: bool = False  # a publish is in flight (never two at once per session)


@dataclass(slots=True)
class Prefill:
    """How far a session's context is in the scorer's cache (roles/verifier_batch.py)."""

    # Context positions already in the cache before the first round's pass (from prefill
    # chunks or imported pages).
    fed: int = 0
    done: bool = False  # a pass has fed its context to the model (later passes feed the new tokens)
    in_pass: bool = False  # a prefill chunk of it is in the pass running now
    chunks_failed: bool = False  # a pass with a prefill chunk of it failed: the rest goes in one pass
    started: float | None = None  # for its log lines
    passes: int = 0


@dataclass(slots=True)
class Waiters:
    """Who waits on a session: output long-polls for its next tokens (a future each, woken
    together: no event object rebuilt per round; their deadlines: :class:`Deadlines`) and
    drafters for the verdicts of their rounds, by round."""

    readers: list[asyncio.Future[None]] = field(default_factory=list)
    verdicts: dict[int, asyncio.Future[Verdict]] = field(default_factory=dict)

    def notify(self) -> None:
        """Wake the output readers: tokens were released, or the session ended."""
        readers, self.readers = self.readers, []
        for reader in readers:
            if not reader.done():
                reader.set_result(None)

    def reader(self, deadlines: Deadlines, remaining: float) -> asyncio.Future[None]:
        """A future woken by the commit that releases tokens (or by the session's end), else
        ``remaining`` seconds from now: no event and no timer of its own per poll."""
        loop = asyncio.get_running_loop()
        reader: asyncio.Future[None] = loop.create_future()
        self.readers.append(reader)
        deadlines.add(loop.time() + remaining, reader)
        return reader

    def cancel(self) -> None:
        """Cancel the drafters' waits (the role is closing)."""
        for future in self.verdicts.values():
            if not future.done():
                future.cancel()

    def fail(self, problem: SdcpProblem) -> None:
        """Answer every output reader (woken) and every waiting drafter (``problem``)."""
        self.notify()
        for future in self.verdicts.values():
            if not future.done():
                future.set_exception(problem)


@dataclass(slots=True)
class LiveSession:
    """The role's record of one served session.

    Whether the session has ended is the core's state, one fact: ``session.closed``
    (finished, failed or fenced). The other two facts near it are not that one:

    - ``gone`` is why this verifier stopped serving the session, which the core need not
      know: a cancel by the router or an open at a newer epoch leaves the core's session as
      it was (a fence ends both). It holds the problem the session's output polls answer.
    - ``ended`` is when :func:`retire_ended` first found the core's session closed, a
      reading of the clock: its record is forgotten ``keep`` seconds from then. Its KV pages
      are given back to the scorer in that same step, so "released" is ``ended is not None``.
    """

    session: VerifierSession
    log: SessionLog
    opened: float = 0.0
    kv: KvPages = field(default_factory=KvPages)
    prefill: Prefill = field(default_factory=Prefill)
    waiters: Waiters = field(default_factory=Waiters)
    gone: SdcpProblem | None = None
    ended: float | None = None

    def fail_waiting(self, problem: SdcpProblem) -> None:
        """This verifier no longer serves the session (``problem`` says why): every output
        reader and drafter waiting on it gets ``problem``."""
        self.gone = problem
        self.waiters.fail(problem)


@dataclass(kw_only=True)
class Round(Scored):
    """A round in the batcher's queue or pass: its work, its session and who waits for it."""

    live: LiveSession
    future: asyncio.Future[Verdict] | None = None  # None for a self-decoded round
    drafter: str | None = None
    started: float = field(default_factory=time.perf_counter)  # for the verdict latency

    def settle(self, outcome: Verdict | SdcpProblem) -> None:
        """Answer the drafter (once); a recorded verdict answers any later retry instead."""
        future = self.future
        verdicts = self.live.waiters.verdicts
        if future is not None and verdicts.get(self.work.round) is future:
            del verdicts[self.work.round]
        if future is None or future.done():
            return
        if isinstance(outcome, Verdict):
            future.set_result(outcome)
        else:
            future.set_exception(outcome)


class Deadlines:
    """Wakes futures at their deadlines (event-loop time) with one timer for all of them.

    The output long-polls each wait up to a deadline; a timer per poll (``asyncio.timeout``)
    cost a timer handle, its heap entry and a context manager per poll, the largest part of
    the verifier's output handler at hundreds of sessions. Here one heap holds every
    deadline and one timer is armed at its earliest. A future answered sooner stays in the
    heap until its deadline passes; waking a done future does nothing. The loop may run a
    timer a little before its time (uvloop keeps whole milliseconds): then nothing is due
    yet and the timer is armed again for the same deadline."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, asyncio.Future[None]]] = []
        self._count = 0  # ties broken by arrival: futures are not comparable
        self._timer: asyncio.TimerHandle | asyncio.Handle | None = None
        self._armed = float("inf")  # the deadline the timer is armed for

    def __len__(self) -> int:
        return len(self._heap)

    def add(self, when: float, future: asyncio.Future[None]) -> None:
        """Wake ``future`` (set its result to None) at loop time ``when`` unless done by then."""
        self._count += 1
        heapq.heappush(self._heap, (when, self._count, future))
        if when < self._armed:  # deadlines mostly grow: the timer seldom moves
            self._arm(when)

    def _arm(self, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._armed = when
        self._timer = asyncio.get_running_loop().call_at(when, self._fire)

    def _fire(self) -> None:
        self._timer, self._armed = None, float("inf")
        heap = self._heap
        now = asyncio.get_running_loop().time()
        while heap and heap[0][0] <= now:
            future = heapq.heappop(heap)[2]
            if not future.done():
                future.set_result(None)
        if heap:
            self._arm(heap[0][0])

    def close(self) -> None:
        """Cancel the timer and forget the deadlines (the role is closing; its server cancels
        the handlers still waiting). A later ``add`` arms a timer again."""
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._armed = None, float("inf")
        self._heap.clear()


class Background:
    """Tasks nobody awaits (events to the router, KV publishes), cancelled on close."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def cancel(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


ENDED_KEEP = 60.0  # seconds an ended session still answers its output (a resumed stream's tail)
ENDED_MOST = 256  # ended sessions kept at most; beyond it the oldest are forgotten first


def retire_ended(sessions: SessionRegistry[LiveSession], release: Callable[[bytes], None], now: float, *,
                 keep: float = ENDED_KEEP, most: int = ENDED_MOST) -> int:
    """Free what ended (finished, failed or fenced) sessions hold: their KV pages at once, their
    record ``keep`` seconds after it was first found ended, or sooner beyond ``most`` ended ones,
    so that a long-running verifier's table, memory and per-round scans stay the size of its
    open sessions. Until then an ended session still answers GET output. Call it between
    scoring passes: ``release`` changes the scorer's cache. Returns the sessions forgotten."""
    ended: list[LiveSession] = []
    for live in sessions.records():
        if not live.session.closed or live.kv.busy or live.prefill.in_pass:
            continue
        if live.ended is None:
            release(live.session.session)
            live.ended = now
        ended.append(live)
    ended.sort(key=lambda live: live.ended or now)
    excess = len(ended) - most
    forgotten = 0
    for i, live in enumerate(ended):
        if i < excess or now - (live.ended or now) >= keep:
            sessions.remove(live.session.session)
            forgotten += 1
    return forgotten
