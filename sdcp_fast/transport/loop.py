"""The event loop the network transport runs on: uvloop when installed, else asyncio's.

uvloop's TLS transport does the same work with less Python per read and write; the
adapters run unchanged on either (tests run on whichever this picks). Every loop of the
project comes from :func:`new_loop`: :func:`run` for a service (which also takes its
startup heap out of the garbage collector's passes, :func:`settle_heap`) or a command,
:class:`LoopThread` for blocking callers of coroutine APIs (the MLC and commit-log clients),
and the MLC's HTTP/1.1 server.
"""

from __future__ import annotations

import asyncio
import gc
import threading
from collections.abc import Coroutine
from concurrent.futures import Future
from typing import Any, TypeVar

T = TypeVar("T")

# The youngest generation's threshold while a service serves (CPython's default: 700). A round
# lives from its proposal to its verdict, tens of milliseconds, while hundreds of sessions
# allocate: at 700 allocations a collection, rounds alive at the time were walked again and
# again, survived into the older generations, and made full collections (~30 ms each, the loop
# stopped) frequent. At 20,000, most of them are freed by their reference counts first.
SERVING_THRESHOLD = 20_000


def new_loop() -> asyncio.AbstractEventLoop:
    """A new event loop: uvloop's when uvloop is installed."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    return loop


def settle_heap() -> None:
    """Collect once, move every object alive now (modules, torch, a loaded model) into the
    collector's permanent generation (``gc.freeze``), and collect the youngest generation every
    :data:`SERVING_THRESHOLD` allocations from then on.

    A service allocates a few objects per request and per round, which triggers the cyclic
    collector's generations in turn; each full pass would walk the ~200,000 objects of the
    imports again (about 0.2 s on the 2-core development machine). In bench/protocol.py the
    verifier spent 19 % of its CPU time in the collector, 11 % with the heap frozen
    (docs/measurements.md, "Cheaper rounds"). Frozen objects are never collected, so this
    runs once, when startup is done. With the serving threshold the collector's share of the
    verifier's CPU fell again, from 7.6 % to 0.7 % at 256 sessions."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(SERVING_THRESHOLD, *gc.get_threshold()[1:])


def run(main: Coroutine[Any, Any, T], *, settle: bool = False) -> T:
    """``asyncio.run(main)`` on a :func:`new_loop`; a service's process passes ``settle`` to
    settle its heap first (:func:`settle_heap`), a command or a test's process does not (what
    it freezes stays out of the collector for the life of the process)."""
    if settle:
        settle_heap()
    with asyncio.Runner(loop_factory=new_loop) as runner:
        return runner.run(main)


def loop_name() -> str:
    """Which loop :func:`new_loop` makes, for logs and benchmark headers."""
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return "asyncio"
    return "uvloop"


class LoopThread:
    """A :func:`new_loop` running in a daemon thread, for blocking callers of coroutine APIs."""

    def __init__(self, name: str) -> None:
        self.loop = new_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def submit(self, coro: Coroutine[Any, Any, T]) -> Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the thread's loop and wait for its result."""
        return self.submit(coro).result()

    def stop(self) -> None:
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()
