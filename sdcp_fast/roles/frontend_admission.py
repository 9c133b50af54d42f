"""Admission of the front end's requests (roles/frontend_server.py): at most ``per_key``
in flight per holder (an API key, or a client's address when no keys are asked) and
``total`` in all; more wait, in order per holder and in turn across holders (round robin),
up to ``queue`` waiting in all. Only a request that finds the queue full is refused (429):
a burst of clients is served as slots free, not told to retry."""

from __future__ import annotations

import asyncio
from collections import deque

PER_KEY = 64  # requests in flight per key: a verifier's batch (--max-batch)
TOTAL = 256  # in flight in all
QUEUE = 1024  # waiting for a slot, in all


class Admission:
    """Slots and the queue; :meth:`enter` waits for a slot, :meth:`leave` frees it."""

    def __init__(self, per_key: int, total: int | None = None, queue: int = 0) -> None:
        if per_key < 1 or (total is not None and total < 1) or queue < 0:
            raise ValueError("per_key and total must be at least 1, queue at least 0")
        self.per_key, self.total, self.queue = per_key, total, queue
        self.in_flight: dict[str, int] = {}
        self._running = 0
        # Holders with waiters, in turn: the next slot goes to the first one that may take it,
        # which then goes to the back.
        self._waiting: dict[str, deque[asyncio.Future[None]]] = {}
        self._queued = 0

    @property
    def queued(self) -> int:
        return self._queued

    async def enter(self, holder: str) -> bool:
        """Wait for a slot of ``holder``; False at once when the queue is full. Cancelled while
        it waits, it leaves the queue (and a slot given meanwhile is freed)."""
        if holder not in self._waiting and self._fits(holder):
            self._take(holder)
            return True
        if self._queued >= self.queue:
            return False
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(holder, deque()).append(turn)
        self._queued += 1
        try:
            await turn
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled():
                self.leave(holder)  # admitted just as its client went
            else:
                self._drop(holder, turn)
            raise
        return True

    def leave(self, holder: str) -> None:
        self.in_flight[holder] -= 1
        if not self.in_flight[holder]:
            del self.in_flight[holder]
        self._running -= 1
        self._wake()

    def _fits(self, holder: str) -> bool:
        return self.in_flight.get(holder, 0) < self.per_key and (self.total is None or self._running < self.total)

    def _take(self, holder: str) -> None:
        self.in_flight[holder] = self.in_flight.get(holder, 0) + 1
        self._running += 1

    def _drop(self, holder: str, turn: asyncio.Future[None]) -> None:
        waiters = self._waiting.get(holder)
        if waiters is not None and turn in waiters:
            waiters.remove(turn)
            self._queued -= 1
            if not waiters:
                del self._waiting[holder]

    def _wake(self) -> None:
        while True:
            holder = next((h for h in self._waiting if self._fits(h)), None)
            if holder is None:
                return
            waiters = self._waiting.pop(holder)
            turn = waiters.popleft()
            self._queued -= 1
            if waiters:
                self._waiting[holder] = waiters  # to the back: the others' turn first
            if turn.cancelled():  # its client went; its task has yet to see it
                continue
            self._take(holder)
            turn.set_result(None)
