"""Storage backends of the SDCP commit log (§6.8), chosen by the reference's scheme.

``open_commit_log(ref)``: ``file:///path`` (embedded, fsync'd file), ``mlc://...`` (the
file log an MLC keeps under its root, :mod:`sdcp_fast.commitlog.directory`), ``etcd://host:port/prefix``
(multi-machine), and ``http(s)://host:port/logs/<mlc-uri-without-scheme>`` (an
``sdcp-fast mlc`` server). What a failed append means is the same for all of them
(:mod:`sdcp_fast.commitlog.backend`). This package knows nothing of the cache.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import Any

from sdcp_fast.commitlog.backend import (
    CommitLog,
    Fenced,
    LogCorrupt,
    LogView,
    PreconditionFailed,
    RecordTooLarge,
    UnknownLog,
    append_checked,
    etag_of,
    length_of,
)
from sdcp_fast.protocol.commitlog import LogRecord
from sdcp_fast.protocol.problems import SdcpProblem

# The cache's problem type for a lease that expired or was released (matched by suffix:
# this package does not import the cache).
UNKNOWN_LEASE = "mlc-unknown-lease"

__all__ = [
    "CommitLog", "Fenced", "LogCorrupt", "LogView", "PreconditionFailed", "RecordTooLarge", "UnknownLog",
    "append_checked", "append_commit", "default_root", "etag_of", "length_of", "open_commit_log",
]


def default_root() -> str:
    return os.environ.get("SDCP_MLC_ROOT") or os.path.join(os.path.expanduser("~"), ".cache", "sdcp_fast", "mlc")


def open_commit_log(ref: str, *, root: str | None = None, ssl: Any = None) -> CommitLog:
    """The commit log named by ``ref``. An ``mlc://`` name is the file log under ``root``
    (default ``$SDCP_MLC_ROOT``; a store composes its own, :mod:`sdcp_fast.store`); ``ssl``
    is the client context for https references."""
    if ref.startswith("file://"):
        from sdcp_fast.commitlog.file import FileCommitLog

        return FileCommitLog(ref[len("file://"):])
    if ref.startswith("mlc://"):
        from sdcp_fast.commitlog.file import FileCommitLog, log_path

        return FileCommitLog(log_path(root or default_root(), ref))
    if ref.startswith("etcd://"):
        from sdcp_fast.commitlog.etcd import EtcdCommitLog

        return EtcdCommitLog.from_ref(ref)
    if ref.startswith(("http://", "https://")):
        from sdcp_fast.commitlog.http import HttpCommitLog

        return HttpCommitLog(ref, ssl=ssl)
    raise ValueError(f"no commit-log backend for {ref!r}")


def append_commit(log: CommitLog, record: LogRecord, etag: str, *,
                  release: Callable[[str], None] | None = None, mlc: Any = None,
                  leases: Iterable[str] = ()) -> str:
    """The verifier's commit path (§6.8): append ``record`` conditioned on the tag it last
    saw (with the read-after-append check where the backend does not fence), then release
    ``leases`` (its holds on the round's draft objects) through ``release`` (default:
    ``mlc.release``).

    The leases are released whether or not the append succeeds: after a failure the round
    is discarded. A lease that is already gone (the cache's ``mlc-unknown-lease``) is skipped. ``Fenced`` means a newer epoch owns the session: the caller stops
    serving it; ``PreconditionFailed`` means another writer appended, which with one
    verifier per session means the same. Returns the log's new tag.
    """
    if release is None and mlc is not None:
        release = mlc.release
    try:
        return append_checked(log, record, etag)
    finally:
        if release is not None:
            for lease in leases:
                try:
                    release(lease)
                except SdcpProblem as problem:
                    if problem.suffix != UNKNOWN_LEASE:
                        raise  # expired meanwhile is fine: nothing left to release
