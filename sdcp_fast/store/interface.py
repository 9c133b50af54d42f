"""What the roles need of the store (draft §1.4, §6.2, §6.8): objects, their leases, and
commit logs, as one typed asynchronous interface.

Two implementations satisfy it: :class:`~sdcp_fast.store.local_store.LocalStore` (the cache and
the file commit logs in this process) and :class:`~sdcp_fast.store.remote_store.RemoteStore` (an
``sdcp-fast mlc`` server over the project's transport). A role is typed against
:class:`Store` and never learns which one it was given.

Failures keep the cache's and the commit log's contracts: a missing object is
:class:`~sdcp_fast.cache.failures.ObjectUnavailable`, a stale append
:class:`~sdcp_fast.commitlog.backend.PreconditionFailed`, a fenced one
:class:`~sdcp_fast.commitlog.backend.Fenced`; no answer from a remote store is a
ConnectionError.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple, Protocol

from sdcp_fast.cache.index import Head
from sdcp_fast.commitlog.backend import LogView
from sdcp_fast.protocol.commitlog import LogRecord


class Log(Protocol):
    """One commit log (§6.8). The entity tag of a log is its record count, quoted."""

    ref: str

    async def read(self, start: int = 0) -> LogView:
        """The records from ``start`` on and the tag of the whole log."""
        ...

    async def append(self, record: LogRecord, if_match: str | None) -> str:
        """Append ``record`` if the log's tag is still ``if_match`` (None: unconditionally),
        fenced: raises Fenced when a fence with a higher epoch precedes it (checked where the
        backend cannot, by reading back), PreconditionFailed on a stale tag, RecordTooLarge.
        Returns the log's new tag."""
        ...


class LogAppend(NamedTuple):
    """One entry of :meth:`Store.append_batch`: ``record`` to ``log`` (a log this store's
    :meth:`Store.commit_log` gave) if its tag is still ``if_match``; fenced as every append."""

    log: Log
    record: LogRecord
    if_match: str | None


class Store(Protocol):
    """Objects named by ``mlc://`` URIs, the leases that pin them, and commit logs."""

    async def put(self, uri: str, data: Any, lease_ttl: float | None = None) -> str | None:
        """Store a copy of ``data`` (a buffer or a tensor); with ``lease_ttl`` the object is
        born leased for that many seconds and the lease id is returned."""
        ...

    async def get(self, uri: str) -> memoryview:
        """The object's bytes, the caller's own (nobody else writes them)."""
        ...

    async def head(self, uri: str) -> Head:
        """The object's size, entity tag, tier and whether it is leased."""
        ...

    async def delete(self, uri: str) -> None:
        ...

    async def release(self, lease: str, *, drop: bool = False) -> None:
        """Give up a lease (UnknownLease if it expired or was released). With ``drop``, the
        object put under this lease is spent: deleted once no other lease holds it."""
        ...

    async def commit_log(self, ref: str) -> Log:
        """The commit log ``ref`` names: an ``mlc://`` name is the store's own; ``file://``,
        ``etcd://`` and ``http(s)://`` references are opened with their backend."""
        ...

    async def append_batch(self, entries: Sequence[LogAppend]) -> list[str | Exception]:
        """Group commit: every entry appended as ``entry.log.append`` would, each checked
        (fence, then tag) and answered on its own, in order: the log's new tag, or the
        exception that append would raise (one entry's fence or stale tag fails only that
        entry). The entries on this store's own logs travel together (one request, one flush
        where the backend can); the others are appended concurrently. Never raises for an
        entry's failure."""
        ...

    async def aclose(self) -> None:
        ...
