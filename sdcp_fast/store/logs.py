"""Commit-log backends with blocking calls (the file and etcd logs, :mod:`sdcp_fast.commitlog`)
as the store's awaitable :class:`~sdcp_fast.store.interface.Log`: every call runs on a worker
thread, so an fsync or a network round trip never holds up the event loop."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

from sdcp_fast.commitlog import CommitLog, append_checked, open_commit_log
from sdcp_fast.commitlog.backend import LogView
from sdcp_fast.commitlog.etcd import EtcdCommitLog, append_many
from sdcp_fast.protocol.commitlog import LogRecord
from sdcp_fast.store.interface import Log, LogAppend


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


async def append_each(entries: Sequence[LogAppend]) -> list[str | Exception]:
    """:meth:`~sdcp_fast.store.interface.Store.append_batch` for logs of any backend, each
    entry answered on its own: the appends to etcd logs together in one worker-thread call
    (:func:`~sdcp_fast.commitlog.etcd.append_many`: combined transactions), every other one
    its own ``append``, all concurrently."""
    results: list[str | Exception] = [ValueError("not appended")] * len(entries)
    etcd = [i for i, e in enumerate(entries) if isinstance(e.log, ThreadedLog) and isinstance(e.log.log, EtcdCommitLog)]
    rest = sorted(set(range(len(entries))) - set(etcd))

    async def pipelined() -> None:
        batch = [(entries[i].log.log, entries[i].record, entries[i].if_match) for i in etcd]  # type: ignore[attr-defined]
        for i, result in zip(etcd, await asyncio.to_thread(append_many, batch), strict=True):
            results[i] = result

    async def one(i: int) -> None:
        try:
            results[i] = await entries[i].log.append(entries[i].record, entries[i].if_match)
        except Exception as exc:
            results[i] = exc

    await asyncio.gather(*([pipelined()] if etcd else []), *(one(i) for i in rest))
    return results


async def append_split(entries: Sequence[LogAppend], own: Callable[[Log], bool],
                       together: Callable[[list[LogAppend]], Awaitable[list[str | Exception]]]
                       ) -> list[str | Exception]:
    """A store's ``append_batch``: the entries on logs the store serves itself (``own``) go
    to ``together`` (one request, one flush), the others to :func:`append_each`; both run
    concurrently and each entry keeps its own answer, in the entries' order."""
    mine = [i for i, e in enumerate(entries) if own(e.log)]
    if not mine:
        return await append_each(entries)
    taken = set(mine)
    rest = [i for i in range(len(entries)) if i not in taken]
    grouped, others = await asyncio.gather(together([entries[i] for i in mine]),
                                           append_each([entries[i] for i in rest]))
    results: list[str | Exception] = [ValueError("not appended")] * len(entries)
    for i, result in zip(mine + rest, grouped + others, strict=True):
        results[i] = result
    return results
