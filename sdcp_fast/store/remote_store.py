"""The store of an ``sdcp-fast mlc`` server, reached over the project's transport: objects
and leases with :class:`~sdcp_fast.cache.http_client.AsyncMLC`, the server's commit logs with
:class:`~sdcp_fast.commitlog.http.AsyncHttpCommitLog`, both on one transport (HTTP/2 with
this service's client certificate: one connection, a stream per call, no thread). On the
server's own host, large objects go through its shared memory instead
(:class:`~sdcp_fast.store.shm_client.ShmClient`)."""

from __future__ import annotations

import ssl
from collections.abc import Sequence
from typing import Any

from sdcp_fast.cache.http_client import AsyncMLC, mlc_transport
from sdcp_fast.cache.index import Head
from sdcp_fast.commitlog.http import AsyncHttpCommitLog, append_batch
from sdcp_fast.store.interface import Log, LogAppend
from sdcp_fast.store.logs import append_split, open_backend
from sdcp_fast.store.shm_client import ShmClient
from sdcp_fast.transport.base import Transport


class RemoteStore:
    """:class:`~sdcp_fast.store.interface.Store` served at ``base_url`` through ``transport``
    (by default :func:`~sdcp_fast.cache.http_client.mlc_transport` with the client context
    ``ssl``; without one, h2c on loopback). ``shm=False``: every object crosses the network."""

    def __init__(self, base_url: str, transport: Transport | None = None, *,
                 ssl: ssl.SSLContext | None = None, shm: bool = True) -> None:
        self.base_url = base_url.rstrip("/")
        self.transport = transport if transport is not None else mlc_transport(ssl)
        self.objects = AsyncMLC(self.base_url, self.transport)
        self.shm = ShmClient(self.base_url, self.transport) if shm else None

    async def put(self, uri: str, data: Any, lease_ttl: float | None = None) -> str | None:
        if self.shm is not None and (stored := await self.shm.put(uri, data, lease_ttl)) is not None:
            return stored.lease
        return (await self.objects.put(uri, data, lease_ttl)).lease

    async def get(self, uri: str) -> memoryview:
        if self.shm is not None and (view := await self.shm.get(uri)) is not None:
            return view
        return await self.objects.get(uri)

    async def head(self, uri: str) -> Head:
        return await self.objects.head(uri)

    async def delete(self, uri: str) -> None:
        await self.objects.delete(uri)

    async def release(self, lease: str, *, drop: bool = False) -> None:
        await self.objects.release(lease, drop=drop)

    async def commit_log(self, ref: str) -> Log:
        if ref.startswith("mlc://"):
            return AsyncHttpCommitLog.on_server(self.base_url, ref, self.transport)
        if ref.startswith(("http://", "https://")):
            return AsyncHttpCommitLog(ref, self.transport)
        return await open_backend(ref)

    async def append_batch(self, entries: Sequence[LogAppend]) -> list[str | Exception]:
        """The entries on this server's logs as one ``POST /logs`` (group commit:
        :func:`~sdcp_fast.commitlog.http.append_batch`), the others with their backends
        (:func:`~sdcp_fast.store.logs.append_each`), concurrently."""

        async def together(mine: list[LogAppend]) -> list[str | Exception]:
            return await append_batch([(e.log, e.record, e.if_match) for e in mine])  # type: ignore[misc]

        return await append_split(entries, self._own, together)

    def _own(self, log: Log) -> bool:
        """Whether ``log`` is a log of this server reached on this store's transport."""
        return (isinstance(log, AsyncHttpCommitLog) and log.transport is self.transport
                and log._base.rstrip("/") == self.base_url)

    async def aclose(self) -> None:
        await self.transport.close()
