"""The embedded default store: the multi-level cache and its commit logs, side by side.

``sdcp_fast.cache`` (objects, leases) and ``sdcp_fast.commitlog`` (fenced logs) do not
import each other; this module composes them. ``embedded(root)`` gives one object with the
whole cache API of :class:`sdcp_fast.cache.MLC` plus ``commit_log(name)``: the file log
of an ``mlc://`` name under ``<root>/logs`` (at most ``max_open_logs`` descriptors open).
"""

from __future__ import annotations

import time
from typing import Any

from sdcp_fast import cache
from sdcp_fast.cache.store import MLC, Clock
from sdcp_fast.commitlog.directory import MAX_OPEN, DirectoryLog, LogDirectory


class EmbeddedStore:
    """An MLC and the commit logs kept under its root. Cache methods are the MLC's."""

    def __init__(self, mlc: MLC, logs: LogDirectory) -> None:
        self.mlc = mlc
        self.logs = logs

    def commit_log(self, name: str) -> DirectoryLog:
        """The commit log called ``name`` (an ``mlc://.../commit_log`` URI)."""
        return self.logs.log(name)

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.mlc, attr)

    def close(self) -> None:
        self.logs.close()
        self.mlc.close()

    def __enter__(self) -> EmbeddedStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def embedded(root: str | None = None, *, host_bytes: int = 1024 * cache.MiB, disk_bytes: int = 16384 * cache.MiB,
             device_bytes: int = 0, redis_url: str | None = None, redis_bytes: int = 4096 * cache.MiB,
             clock: Clock = time.monotonic, max_open_logs: int = MAX_OPEN, **limits: int) -> EmbeddedStore:
    """``sdcp_fast.cache.embedded`` (same arguments; ``limits`` are the MLC's ``max_objects``,
    ``index_bytes``, ``max_leases``) with its commit logs under the same root."""
    mlc = cache.embedded(root, host_bytes=host_bytes, disk_bytes=disk_bytes, device_bytes=device_bytes,
                         redis_url=redis_url, redis_bytes=redis_bytes, clock=clock, **limits)
    assert mlc.root is not None  # the embedded MLC always has a disk tier
    return EmbeddedStore(mlc, LogDirectory(mlc.root, max_open=max_open_logs))
