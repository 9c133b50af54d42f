"""The roles' retry loop (sdcp_fast/roles/retry.py): what is tried again, how often, how long
it waits."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from sdcp_fast.protocol import BadRequest
from sdcp_fast.protocol.problems import problem_from_response
from sdcp_fast.roles.retry import backoff, retrying, unreachable_or_5xx

RESTARTING = problem_from_response(503, None)  # a server error of no listed type


def test_backoff_doubles_up_to_its_cap() -> None:
    assert [backoff(a, 0.02) for a in range(4)] == [0.02, 0.04, 0.08, 0.16]
    assert backoff(10, 0.02) == 1.0 and backoff(3, 0.05, max_delay=0.3) == 0.3


def test_unreachable_or_5xx_may_pass_a_4xx_does_not() -> None:
    assert unreachable_or_5xx(ConnectionError()) and unreachable_or_5xx(TimeoutError())
    assert unreachable_or_5xx(RESTARTING)
    assert not unreachable_or_5xx(BadRequest("x")) and not unreachable_or_5xx(ValueError())


def _flaky(failures: list[BaseException]) -> tuple[list[int], Callable[[int], Awaitable[str]]]:
    tries: list[int] = []

    async def call(attempt: int) -> str:
        tries.append(attempt)
        if failures:
            raise failures.pop(0)
        return "ok"

    return tries, call


def test_transient_failures_are_tried_again_with_growing_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)

    monkeypatch.setattr(asyncio, "sleep", sleep)
    tries, call = _flaky([ConnectionError(), RESTARTING, TimeoutError()])
    retried: list[int] = []
    out = asyncio.run(retrying(call, attempts=5, first_delay=0.02, on_retry=lambda a, _: retried.append(a)))
    assert out == "ok" and tries == [0, 1, 2, 3] and retried == [0, 1, 2]
    assert waits == [0.02, 0.04, 0.08]


def test_a_final_failure_or_the_last_attempt_raises() -> None:
    tries, call = _flaky([ConnectionError(), BadRequest("no")])
    with pytest.raises(BadRequest):
        asyncio.run(retrying(call, attempts=5, first_delay=0.0))
    assert tries == [0, 1]
    tries, call = _flaky([ConnectionError("1"), ConnectionError("2"), ConnectionError("3")])
    with pytest.raises(ConnectionError, match="2"):
        asyncio.run(retrying(call, attempts=2, first_delay=0.0))
    assert tries == [0, 1]


def test_transient_decides_what_is_tried_again() -> None:
    tries, call = _flaky([TimeoutError()])
    with pytest.raises(TimeoutError):
        asyncio.run(retrying(call, attempts=4, first_delay=0.0, transient=lambda e: isinstance(e, ConnectionRefusedError)))
    assert tries == [0]
