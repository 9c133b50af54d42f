"""Commit-log backends with blocking calls (the file and etcd logs, :mod:`sdcp_fast.commitlog`)
as the store's awaitable :class:`~sdcp_fast.store.interface.Log`: every call runs on a worker
thread, so an fsync or a network round trip never holds up the event loop."""

from __future__ import annotations

import asyncio

from sdcp_fast.commitlog import CommitLog, append_checked, open_commit_log
from sdcp_fast.commitlog.backend import LogView
from sdcp_fast.protocol.commitlog import LogRecord


class ThreadedLog:
    """A :class:`~sdcp_fast.commitlog.backend.CommitLog` whose calls run on worker threads;
    appends are checked (§6.8's read-after-append where the backend does not fence)."""

    def __init__(self, log: CommitLog) -> None:
        self.log = log
        self.ref = log.ref

    async def read(self, start: int = 0) -> LogView:
        return await asyncio.to_thread(self.log.read, start)

    async def append(self, record: LogRecord, if_match: str | None) -> str:
        return await asyncio.to_thread(append_checked, self.log, record, if_match)


async def open_backend(ref: str) -> ThreadedLog:
    """A ``file://``, ``etcd://`` or ``http(s)://`` log opened by its own backend (ValueError
    for a reference no backend serves)."""
    return ThreadedLog(await asyncio.to_thread(open_commit_log, ref))
