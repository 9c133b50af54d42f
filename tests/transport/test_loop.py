"""The project's event loops (sdcp_fast/transport/loop.py): uvloop's when installed, for a
service's run and for a loop kept in a thread."""

from __future__ import annotations

import asyncio
import gc
import importlib.util
import threading
import weakref

from sdcp_fast.transport.loop import SERVING_THRESHOLD, LoopThread, loop_name, new_loop, run

UVLOOP = importlib.util.find_spec("uvloop") is not None


def test_new_loop_is_uvloop_when_installed() -> None:
    loop = new_loop()
    try:
        assert (type(loop).__module__.startswith("uvloop")) == UVLOOP
        assert loop_name() == ("uvloop" if UVLOOP else "asyncio")
    finally:
        loop.close()


def test_run_runs_a_coroutine_on_a_new_loop() -> None:
    async def which() -> str:
        return type(asyncio.get_running_loop()).__module__

    assert run(which()).startswith("uvloop") == UVLOOP


def test_loop_thread_runs_coroutines_off_the_calling_thread_until_stopped() -> None:
    runner = LoopThread("test-loop")

    async def where() -> str:
        await asyncio.sleep(0)
        return threading.current_thread().name

    assert runner.run(where()) == "test-loop"
    assert runner.submit(where()).result(5) == "test-loop"
    runner.stop()
    runner.stop()  # a second stop is harmless
    assert runner.loop.is_closed()


def test_run_for_a_service_collects_then_freezes_the_startup_heap() -> None:
    """A service's imports and model stay out of the collector's passes (gc.freeze); the
    garbage of startup is collected first, not frozen with them; the youngest generation is
    then collected less often. A plain run freezes nothing and keeps the thresholds."""
    thresholds = gc.get_threshold()
    assert run(_freeze_count()) == gc.get_freeze_count() == 0
    assert gc.get_threshold() == thresholds

    class Node:
        other: object = None

    cycle = Node()
    cycle.other = cycle
    gone = weakref.ref(cycle)
    del cycle

    try:
        assert run(_freeze_count(), settle=True) > 0
        assert gone() is None
        assert gc.get_threshold() == (SERVING_THRESHOLD, *thresholds[1:])
    finally:
        gc.unfreeze()  # this test process is not a service
        gc.set_threshold(*thresholds)


async def _freeze_count() -> int:
    return gc.get_freeze_count()
