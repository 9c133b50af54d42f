"""The event loop the network transport runs on: uvloop when installed, else asyncio's.

uvloop's TLS transport does the same work with less Python per read and write; the
adapters run unchanged on either (tests run on whichever this picks)."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def run(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(main)`` on a new uvloop loop when uvloop is installed."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)


def loop_name() -> str:
    """Which loop :func:`run` uses, for logs and benchmark headers."""
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return "asyncio"
    return "uvloop"
