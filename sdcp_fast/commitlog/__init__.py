"""Storage backends of the SDCP commit log (§6.8), chosen by the reference's scheme.

``open_commit_log(ref)``: ``file:///path`` (embedded, fsync'd file), ``mlc://...`` (the
embedded MLC's file log under its root), ``etcd://host:port/prefix`` (multi-machine), and
``http(s)://host:port/logs/<mlc-uri-without-scheme>`` (an ``sdcp-fast mlc`` server).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from sdcp_fast.cache.errors import UnknownLease
from sdcp_fast.commitlog.base import CommitLog, Fenced, LogView, PreconditionFailed, etag_of, length_of
from sdcp_fast.protocol.commitlog import LogRecord

__all__ = [
    "CommitLog", "Fenced", "LogView", "PreconditionFailed", "append_commit", "default_root", "etag_of",
    "length_of", "open_commit_log",
]


def default_root() -> str:
    return os.environ.get("SDCP_MLC_ROOT") or os.path.join(os.path.expanduser("~"), ".cache", "sdcp_fast", "mlc")


def open_commit_log(ref: str, *, mlc: Any = None, ssl: Any = None) -> CommitLog:
    """The commit log named by ``ref``; ``mlc`` serves ``mlc://`` names (else a file under
    ``$SDCP_MLC_ROOT``); ``ssl`` is the client context for https references."""
    if ref.startswith("file://"):
        from sdcp_fast.commitlog.file import FileCommitLog

        return FileCommitLog(ref[len("file://"):])
    if ref.startswith("mlc://"):
        if mlc is not None:
            log: CommitLog = mlc.commit_log(ref)
            return log
        from sdcp_fast.commitlog.file import FileCommitLog, log_path

        return FileCommitLog(log_path(default_root(), ref))
    if ref.startswith("etcd://"):
        from sdcp_fast.commitlog.etcd import EtcdCommitLog

        return EtcdCommitLog.from_ref(ref)
    if ref.startswith(("http://", "https://")):
        from sdcp_fast.cache.client import HttpCommitLog

        return HttpCommitLog(ref, ssl=ssl)
    raise ValueError(f"no commit-log backend for {ref!r}")


def append_commit(log: CommitLog, record: LogRecord, etag: str, *, mlc: Any = None,
                  leases: Iterable[str] = ()) -> str:
    """The verifier's commit path (§6.8): append ``record`` conditioned on the tag it last
    saw, then release ``leases`` (its holds on the round's draft objects) in ``mlc``.

    The leases are released whether or not the append succeeds: after a failure the round
    is discarded. ``Fenced`` means a newer epoch owns the session: the caller stops serving
    it; ``PreconditionFailed`` means another writer appended, which with one verifier per
    session means the same. Returns the log's new tag.
    """
    try:
        return log.append(record, etag)
    finally:
        if mlc is not None:
            for lease in leases:
                try:
                    mlc.release(lease)
                except UnknownLease:
                    pass  # expired meanwhile: nothing left to release
