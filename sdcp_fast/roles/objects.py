"""How the roles use the MLC: token-list objects and an awaitable facade over the store.

Token objects (``prompt``, ``committed_tokens``; docs/interpretations.md, "MLC objects")
hold the tokens as uint32 in network byte order, concatenated: the encoding §4.2 digests,
so a reader can check the object against a digest it already trusts.
"""

from __future__ import annotations

import asyncio
import inspect
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


def _nonblocking(obj: Any) -> bool:
    """A store or log whose calls return coroutines (``AsyncMLC``, ``AsyncHttpCommitLog``,
    ``RemoteStore``): calling one only starts I/O on the event loop."""
    return bool(getattr(obj, "nonblocking", False))


class Objects:
    """Awaitable calls on the MLC: the embedded ``MLC`` (synchronous) or a remote client
    whose calls are coroutines (a service's :class:`~sdcp_fast.deploy.service.RemoteStore`
    over HTTP/2). A remote client's calls are awaited on the loop, never on a thread. Other
    synchronous calls leave the event loop when an ``executor`` is given (a scoring pass, a
    draft); without one they run inline (in process, where a call into the embedded store
    costs less than a thread hop)."""

    def __init__(self, mlc: Any, executor: Executor | None = None) -> None:
        self.mlc = mlc
        self._executor = executor

    def _inline(self, fn: Any, args: tuple[Any, ...], kw: dict[str, Any]) -> bool:
        if self._executor is None or inspect.iscoroutinefunction(fn):
            return True
        # A call on (or about) a nonblocking store: e.g. ``log.read`` of a remote log, or
        # ``append_checked(log, ...)`` and ``open_commit_log(ref, mlc=store)`` given one.
        return _nonblocking(getattr(fn, "__self__", None)) or any(map(_nonblocking, (*args, *kw.values())))

    async def _run(self, fn: Any, *args: Any, **kw: Any) -> Any:
        if self._inline(fn, args, kw):
            out = fn(*args, **kw)
        else:
            out = await asyncio.get_running_loop().run_in_executor(self._executor, lambda: fn(*args, **kw))
        if inspect.isawaitable(out):
            # A remote log's append_checked is its append (the server fences): a coroutine.
            out = await out
        return out

    async def put(self, uri: str, data: Any, lease_ttl: float | None = None) -> str | None:
        """Store ``data``; the lease id when ``lease_ttl`` is given."""
        stored = await self._run(self.mlc.put, uri, data, lease_ttl)
        return stored.lease  # type: ignore[no-any-return]

    async def get(self, uri: str) -> bytearray:
        """A private copy of the object's bytes (the store's view may be reused)."""
        if _nonblocking(self.mlc):
            return bytearray(await self.mlc.get(uri))
        return await self._run(lambda: bytearray(self.mlc.get(uri)))  # type: ignore[no-any-return]

    async def release(self, lease: str) -> None:
        await self._run(self.mlc.release, lease)

    async def delete(self, uri: str) -> None:
        await self._run(self.mlc.delete, uri)

    async def exists(self, uri: str) -> bool:
        return bool(await self._run(self.mlc.contains, uri))

    async def tokens(self, uri: str) -> tuple[int, ...]:
        return unpack_tokens(await self.get(uri))

    async def call(self, fn: Any, *args: Any, **kw: Any) -> Any:
        """Any other call that belongs with the store's (a commit-log append, a scoring pass):
        a coroutine's result is awaited."""
        return await self._run(fn, *args, **kw)
