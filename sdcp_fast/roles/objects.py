"""How the roles use the store: token-list objects, and the role's own blocking work kept
off the event loop.

Token objects (``prompt``, ``committed_tokens``; docs/interpretations.md, "MLC objects")
hold the tokens as uint32 in network byte order, concatenated: the encoding §4.2 digests,
so a reader can check the object against a digest it already trusts.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import Executor
from typing import Any, TypeVar

from sdcp_fast.cache.failures import ObjectUnavailable
from sdcp_fast.protocol import BadRequest
from sdcp_fast.store.interface import Store

T = TypeVar("T")


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
    """A role's calls on its ``store`` (awaited on the event loop: the store keeps its own
    copies and disk I/O off it), and its own blocking work (a scoring pass, a draft, encoding
    KV pages) on ``executor``; without one that work runs inline (in process)."""

    def __init__(self, store: Store, executor: Executor | None = None) -> None:
        self.store = store
        self._executor = executor

    # put, get, release and delete hand back the store's own awaitable: they are on every
    # rule-2 round's path, and a coroutine of ours around it would only pass it through.
    def put(self, uri: str, data: Any, lease_ttl: float | None = None) -> Awaitable[str | None]:
        """Store ``data``; the lease id when ``lease_ttl`` is given."""
        return self.store.put(uri, data, lease_ttl)

    def get(self, uri: str) -> Awaitable[memoryview]:
        """The object's bytes, the caller's own."""
        return self.store.get(uri)

    def release(self, lease: str, *, drop: bool = False) -> Awaitable[None]:
        return self.store.release(lease, drop=drop)

    def delete(self, uri: str) -> Awaitable[None]:
        return self.store.delete(uri)

    async def exists(self, uri: str) -> bool:
        try:
            await self.store.head(uri)
        except ObjectUnavailable:
            return False
        return True

    async def tokens(self, uri: str) -> tuple[int, ...]:
        return unpack_tokens(await self.store.get(uri))

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)``, blocking work of the role's own: on the executor when there is one."""
        if self._executor is None:
            return fn(*args)
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)
