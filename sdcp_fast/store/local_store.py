"""The store in this process: the multi-level cache and the file commit logs kept under its
root, composed (``sdcp_fast.cache`` and ``sdcp_fast.commitlog`` do not import each other).

:func:`embedded` builds the default one. Its calls are coroutines that keep the event loop
free: a call on a small object runs inline when the cache's lock is free (a thread hop costs
more than the call), and so does a commit-log append that is not fsync'd; anything else (a
large copy, a disk read, a commit-log fsync) on a worker thread. ``mlc`` and ``logs`` are
the synchronous parts, for a server that adds authorization to every call and for callers
that inspect the store directly.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from sdcp_fast.cache import MiB
from sdcp_fast.cache.failures import ObjectUnavailable
from sdcp_fast.cache.index import MLC, Clock, Head
from sdcp_fast.cache.tiers.mooncake import MooncakeConfig
from sdcp_fast.cache.tiers.tier import Tier
from sdcp_fast.commitlog.directory import MAX_OPEN, DirectoryLog, LogDirectory
from sdcp_fast.store.interface import Log, LogAppend
from sdcp_fast.store.logs import ThreadedLog, append_split, open_backend

T = TypeVar("T")

# Above this many bytes a copy leaves the event loop.
INLINE_BYTES = 256 << 10


async def run_on(mlc: MLC, fn: Callable[[], T], size: int = 0) -> T:
    """``fn`` (a call on ``mlc``): inline when it moves at most ``INLINE_BYTES`` and the
    cache's lock is free, else on a worker thread, so the event loop never waits behind a
    large copy holding the lock."""
    if size <= INLINE_BYTES:
        with mlc.held_if_free() as free:
            if free:
                return fn()
    return await asyncio.to_thread(fn)


def _size(data: Any) -> int:
    if hasattr(data, "untyped_storage"):  # a tensor, without importing torch here
        return int(data.numel() * data.element_size())
    return memoryview(data).nbytes


class LocalStore:
    """:class:`~sdcp_fast.store.interface.Store` over an in-process ``mlc`` and the commit
    logs of ``logs``."""

    def __init__(self, mlc: MLC, logs: LogDirectory) -> None:
        self.mlc = mlc
        self.logs = logs

    async def put(self, uri: str, data: Any, lease_ttl: float | None = None) -> str | None:
        mlc = self.mlc
        return (await run_on(mlc, lambda: mlc.put(uri, data, lease_ttl), _size(data))).lease

    async def get(self, uri: str) -> memoryview:
        mlc = self.mlc
        with mlc.held_if_free() as free:
            if free:
                try:
                    small = mlc.head(uri).size <= INLINE_BYTES
                except ObjectUnavailable:
                    small = True  # the get raises it again, counted as a miss
                if small:
                    return memoryview(bytearray(mlc.get(uri)))
        # The copy out of the cache is made outside its lock, as the cache's views allow.
        return await asyncio.to_thread(lambda: memoryview(bytearray(mlc.get(uri))))

    async def head(self, uri: str) -> Head:
        mlc = self.mlc
        return await run_on(mlc, lambda: mlc.head(uri))

    async def delete(self, uri: str) -> None:
        mlc = self.mlc
        await run_on(mlc, lambda: mlc.delete(uri))

    async def release(self, lease: str, *, drop: bool = False) -> None:
        mlc = self.mlc
        await run_on(mlc, lambda: mlc.release(lease, drop=drop))

    async def commit_log(self, ref: str) -> Log:
        if ref.startswith("mlc://"):
            return ThreadedLog(self.logs.log(ref))
        return await open_backend(ref)

    async def append_batch(self, entries: Sequence[LogAppend]) -> list[str | Exception]:
        """The entries on this store's own logs in one worker-thread call (group commit, one
        flush: :meth:`~sdcp_fast.commitlog.directory.LogDirectory.append_many`), the others
        with their backends (:func:`~sdcp_fast.store.logs.append_each`), concurrently."""
        logs = self.logs

        async def together(mine: list[LogAppend]) -> list[str | Exception]:
            batch = [(e.log.ref, e.record, e.if_match) for e in mine]
            if not logs.sync:  # no flush to wait for: the writes cost less than a thread hop
                return logs.append_many(batch)
            return await asyncio.to_thread(logs.append_many, batch)

        return await append_split(entries, self._own, together)

    def _own(self, log: Log) -> bool:
        """Whether ``log`` is one of this store's file logs, as :meth:`commit_log` opened it."""
        return (isinstance(log, ThreadedLog) and isinstance(log.log, DirectoryLog)
                and log.log.directory is self.logs)

    def close(self) -> None:
        self.logs.close()
        self.mlc.close()

    async def aclose(self) -> None:
        self.close()

    def __enter__(self) -> LocalStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def embedded(root: str | None = None, *, host_bytes: int = 1024 * MiB, disk_bytes: int = 16384 * MiB,
             device_bytes: int = 0, redis_url: str | None = None, redis_bytes: int = 4096 * MiB,
             mooncake: MooncakeConfig | None = None, mooncake_bytes: int = 4096 * MiB,
             clock: Clock = time.monotonic, max_open_logs: int = MAX_OPEN, shm: str | None = None,
             sync_logs: bool = True, **limits: int) -> LocalStore:
    """The default store: an MLC over [device,] page-locked host memory, disk under ``root``
    (a temporary folder when None) [and Redis or Mooncake Store], with its commit logs under ``<root>/logs``
    (at most ``max_open_logs`` descriptors open). With ``shm`` (a folder in memory, e.g.
    ``/dev/shm``) the host tier also keeps same-host uploads there (:mod:`sdcp_fast.cache.tiers.shm`).
    ``sync_logs`` False: appends are not fsync'd (for a store removed with its process's run).
    ``limits``: the MLC's ``max_objects``, ``index_bytes``, ``max_leases``."""
    from sdcp_fast.cache.tiers.disk import DiskTier
    from sdcp_fast.cache.tiers.host import HostTier

    tiers: list[Tier] = []
    if device_bytes:
        from sdcp_fast.cache.tiers.device import DeviceTier

        tiers.append(DeviceTier(device_bytes))
    if shm:
        from sdcp_fast.cache.tiers.shm import ShmTier

        tiers.append(ShmTier(host_bytes, base=shm))
    else:
        tiers.append(HostTier(host_bytes))
    disk = DiskTier(disk_bytes, root)
    tiers.append(disk)
    if redis_url:
        from sdcp_fast.cache.tiers.network import RedisTier

        tiers.append(RedisTier(redis_bytes, redis_url))
    elif mooncake is not None:
        from sdcp_fast.cache.tiers.mooncake import MooncakeTier

        tiers.append(MooncakeTier(mooncake_bytes, mooncake))
    mlc = MLC(tiers, clock=clock, **limits)
    return LocalStore(mlc, LogDirectory(disk.root, max_open=max_open_logs, sync=sync_logs))
