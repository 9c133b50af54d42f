"""Thin asyncio adapter over the synchronous MLC API (in-process ``MLC`` or ``RemoteMLC``),
for servers that must not block their event loop on copies, disk or network I/O."""

from __future__ import annotations

import asyncio
from typing import Any

from sdcp_fast.cache.store import Head, Stored


class AsyncMLC:
    def __init__(self, mlc: Any) -> None:
        self.sync = mlc

    async def put(self, uri: str, data: Any, lease_ttl: float | None = None, *,
                  meta: dict[str, Any] | None = None) -> Stored:
        stored: Stored = await asyncio.to_thread(self.sync.put, uri, data, lease_ttl, meta=meta)
        return stored

    async def get(self, uri: str) -> memoryview:
        view: memoryview = await asyncio.to_thread(self.sync.get, uri)
        return view

    async def get_into(self, uri: str, out: Any) -> int:
        n: int = await asyncio.to_thread(self.sync.get_into, uri, out)
        return n

    async def get_range(self, uri: str, start: int, stop: int | None = None) -> memoryview:
        view: memoryview = await asyncio.to_thread(self.sync.get_range, uri, start, stop)
        return view

    async def head(self, uri: str) -> Head:
        head: Head = await asyncio.to_thread(self.sync.head, uri)
        return head

    async def delete(self, uri: str) -> None:
        await asyncio.to_thread(self.sync.delete, uri)

    async def lease(self, uri: str, ttl: float) -> str:
        lease: str = await asyncio.to_thread(self.sync.lease, uri, ttl)
        return lease

    async def renew(self, lease_id: str, ttl: float) -> None:
        await asyncio.to_thread(self.sync.renew, lease_id, ttl)

    async def release(self, lease_id: str) -> None:
        await asyncio.to_thread(self.sync.release, lease_id)

    async def prefetch(self, uris: list[str]) -> list[bool]:
        """Awaitable prefetch: start it with ``asyncio.create_task`` to overlap with scoring."""
        present: list[bool] = await asyncio.wrap_future(self.sync.prefetch(uris))
        return present
