"""The project's event loops (sdcp_fast/transport/loop.py): uvloop's when installed, for a
service's run and for a loop kept in a thread."""

from __future__ import annotations

import asyncio
import importlib.util
import threading

from sdcp_fast.transport.loop import LoopThread, loop_name, new_loop, run

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
