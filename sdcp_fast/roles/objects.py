"""How the roles use the MLC: token-list objects and an awaitable facade over the store.

Token objects (``prompt``, ``committed_tokens``; docs/interpretations.md, "MLC objects")
hold the tokens as uint32 in network byte order, concatenated: the encoding §4.2 digests,
so a reader can check the object against a digest it already trusts.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Sequence
from concurrent.futures import Executor
from typing import Any

from sdcp_fast.protocol import BadRequest


def pack_tokens(tokens: Sequence[int]) -> bytes:
    try:
        return struct.pack(f">{len(tokens)}I", *tokens)
    except struct.error:
        raise BadRequest("a token does not fit in uint32") from None


def unpack_tokens(data: bytes | bytearray | memoryview) -> tuple[int, ...]:
    raw = bytes(data)
    if len(raw) % 4:
        raise BadRequest("a token object's length is not a multiple of 4")
    return struct.unpack(f">{len(raw) // 4}I", raw)


class Objects:
    """Awaitable calls on a synchronous MLC (the embedded ``MLC`` or a remote client). With
    an ``executor`` the calls leave the event loop (a service must keep serving while a
    remote store answers); without one they run inline (in process, where a call into the
    embedded store costs less than a thread hop)."""

    def __init__(self, mlc: Any, executor: Executor | None = None) -> None:
        self.mlc = mlc
        self._executor = executor

    async def _run(self, fn: Any, *args: Any, **kw: Any) -> Any:
        if self._executor is None:
            return fn(*args, **kw)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, lambda: fn(*args, **kw))

    async def put(self, uri: str, data: Any, lease_ttl: float | None = None) -> str | None:
        """Store ``data``; the lease id when ``lease_ttl`` is given."""
        stored = await self._run(self.mlc.put, uri, data, lease_ttl)
        return stored.lease  # type: ignore[no-any-return]

    async def get(self, uri: str) -> bytearray:
        """A private copy of the object's bytes (the store's view may be reused)."""
        return await self._run(lambda: bytearray(self.mlc.get(uri)))  # type: ignore[no-any-return]

    async def release(self, lease: str) -> None:
        await self._run(self.mlc.release, lease)

    async def tokens(self, uri: str) -> tuple[int, ...]:
        return unpack_tokens(await self.get(uri))

    async def call(self, fn: Any, *args: Any, **kw: Any) -> Any:
        """Any other blocking call that belongs with the store's (a commit-log append)."""
        return await self._run(fn, *args, **kw)
