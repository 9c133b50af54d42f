"""What the verifier role keeps beside the core's sessions: per session (its commit log, its
output readers and waiting drafters, its published KV pages), per round in a batch, and the
background tasks of its parts.

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
from typing import Any

from sdcp_fast.protocol import Action, SdcpProblem, Verdict
from sdcp_fast.protocol.registry import SessionRegistry
from sdcp_fast.protocol.session import VerifierSession
from sdcp_fast.roles.scoring import Scored
from sdcp_fast.store.interface import Log


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


@dataclass
class LiveSession:
    """The role's record of one served session."""

    session: VerifierSession
    log: Log
    etag: str  # of the log as this verifier last appended to or read it
    tokens_ref: str | None  # where its committed output is written (None: nowhere)
    opened: float = 0.0
    kv_ref: str | None = None  # where its target KV pages are published (None: nowhere)
    # Committed length (prompt + output) when the last published pages were taken: they hold
    # all of it the cache had (not the last token, which no pass has fed to the model yet).
    kv_published: int = 0
    kv_busy: bool = False  # a publish is in flight (never two at once per session)
    prefilled: bool = False  # a pass here has fed its context to the model (later passes feed the new tokens)
    # Context positions already in the scorer's cache before the first round's pass (from
    # prefill chunks or imported pages), and the prefill's progress for its log lines.
    fed: int = 0
    prefilling: bool = False  # a prefill chunk of it is in the pass running now
    chunks_failed: bool = False  # a pass with a prefill chunk of it failed: the rest goes in one pass
    prefill_started: float | None = None
    prefill_passes: int = 0
    ended: float | None = None  # when retire_ended first found it ended
    released: bool = False  # its KV pages are given back to the scorer
    # The output long-polls waiting for this session's next tokens: a future each, woken
    # together by notify (no event object rebuilt per round; their deadlines: Deadlines).
    readers: list[asyncio.Future[None]] = field(default_factory=list)
    waiting: dict[int, asyncio.Future[Verdict]] = field(default_factory=dict)
    # Why the session left this verifier (cancelled, re-opened at a newer epoch, fenced): its
    # pending output polls answer it instead of waiting for tokens that will never come.
    gone: SdcpProblem | None = None

    def notify(self) -> None:
        """Wake the output readers: tokens were released, or the session ended."""
        readers, self.readers = self.readers, []
        for reader in readers:
            if not reader.done():
                reader.set_result(None)

    def fail_waiting(self, problem: SdcpProblem) -> None:
        """Answer every drafter waiting for a verdict and every output reader with ``problem``."""
        self.gone = problem
        self.notify()
        for future in self.waiting.values():
            if not future.done():
                future.set_exception(problem)


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
        if future is not None and self.live.waiting.get(self.work.round) is future:
            del self.live.waiting[self.work.round]
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

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

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
        if not live.session.closed or live.kv_busy or live.prefilling:
            continue
        if live.ended is None:
            live.ended = now
        if not live.released:
            release(live.session.session)
            live.released = True
        ended.append(live)
    ended.sort(key=lambda live: live.ended or now)
    excess = len(ended) - most
    forgotten = 0
    for i, live in enumerate(ended):
        if i < excess or now - (live.ended or now) >= keep:
            sessions.remove(live.session.session)
            forgotten += 1
    return forgotten
