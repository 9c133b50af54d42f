"""Storage backends of the SDCP commit log (§6.8), chosen by the reference's scheme.

``open_commit_log(ref)``: ``file:///path`` (embedded, fsync'd file), ``mlc://...`` (the
file log an MLC keeps under its root, :mod:`sdcp_fast.commitlog.directory`),
``etcd://host:port/prefix`` (multi-machine), and
``http(s)://host:port/logs/<mlc-uri-without-scheme>`` (an ``sdcp-fast mlc`` server). What a
failed append means is the same for all of them (:mod:`sdcp_fast.commitlog.backend`;
:func:`append_checked` applies §6.8's read-after-append check where a backend does not
fence). This package knows nothing of the cache; :mod:`sdcp_fast.store` composes the two.
"""

from __future__ import annotations

import os
from typing import Any

from sdcp_fast.commitlog.backend import (
    CommitLog,
    Fenced,
    LogCorrupt,
    LogFull,
    LogView,
    PreconditionFailed,
    RecordTooLarge,
    UnknownLog,
    append_checked,
    etag_of,
    length_of,
)

__all__ = [
    "CommitLog", "Fenced", "LogCorrupt", "LogFull", "LogView", "PreconditionFailed", "RecordTooLarge", "UnknownLog",
    "append_checked", "default_root", "etag_of", "length_of", "open_commit_log",
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
