"""Trying a call again after a failure that may pass: the roles' one retry loop.

A peer that restarts (the MLC, a verifier, the router) answers nothing, or 5xx, for a while;
a 4xx answer is final. :func:`retrying` repeats a call with exponentially growing waits
(``first_delay * 2 ** attempt``, at most ``max_delay``) until it succeeds, fails in a way
``transient`` does not forgive, or has used its attempts, when the last failure is raised.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from sdcp_fast.protocol import SdcpProblem

T = TypeVar("T")


def backoff(attempt: int, first_delay: float = 0.05, max_delay: float = 1.0) -> float:
    """Seconds to wait after failed try ``attempt`` (0 for the first)."""
    return min(max_delay, first_delay * 2.0 ** attempt)


def unreachable_or_5xx(exc: BaseException) -> bool:
    """No answer (connection refused or lost, a timeout) or a server error: it may pass."""
    return isinstance(exc, OSError) or (isinstance(exc, SdcpProblem) and exc.status >= 500)


async def retrying(
    call: Callable[[int], Awaitable[T]],
    *,
    attempts: int,
    transient: Callable[[BaseException], bool] = unreachable_or_5xx,
    first_delay: float = 0.05,
    max_delay: float = 1.0,
    on_retry: Callable[[int, BaseException], None] | None = None,
) -> T:
    """``await call(attempt)`` for attempt 0, 1, ...: its result, or the failure that is not
    ``transient`` or comes on the last of ``attempts``. ``on_retry(attempt, exc)`` runs
    before each wait (a counter, a log line)."""
    for attempt in range(attempts):
        try:
            return await call(attempt)
        except Exception as exc:
            if attempt >= attempts - 1 or not transient(exc):
                raise
            if on_retry is not None:
                on_retry(attempt, exc)
        await asyncio.sleep(backoff(attempt, first_delay, max_delay))
    raise ValueError("attempts must be at least 1")
