"""The embedded commit logs: one file log per ``mlc://`` name under ``<root>/logs``.

Logs are opened on demand and closed when idle, so the number of open descriptors stays
at ``max_open`` however many names are used (a log in use is never closed under its
user). Reading a log that was never appended to creates nothing: it reads as empty.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import ClassVar

from sdcp_fast.commitlog.backend import LogView, PreconditionFailed, UnknownLog, etag_of, length_of
from sdcp_fast.commitlog.file import FileCommitLog, append_group, frame, frame_body, log_path
from sdcp_fast.protocol.commitlog import LogRecord

MAX_OPEN = 64


class LogDirectory:
    def __init__(self, root: str, *, max_open: int = MAX_OPEN, sync: bool = True) -> None:
        if max_open < 1:
            raise ValueError("max_open must be at least 1")
        self.root = root
        self.max_open = max_open
        self._sync = sync
        self._lock = threading.Lock()
        self._open: OrderedDict[str, FileCommitLog] = OrderedDict()  # least recently used first
        self._users: dict[str, int] = {}
        self._opening: dict[str, threading.Lock] = {}  # names being opened, by their opener's gate

    @property
    def sync(self) -> bool:
        """Whether an append returns only once its frames are fsync'd."""
        return self._sync

    def log(self, name: str) -> DirectoryLog:
        """A handle on the log ``name``: cheap, holds no descriptor between calls."""
        return DirectoryLog(self, name)

    def exists(self, name: str) -> bool:
        # An open log's file is there (nothing here removes one): no path hash and stat per
        # record of a group commit, whose logs are mostly open.
        return name in self._open or os.path.exists(log_path(self.root, name))

    @property
    def open_count(self) -> int:
        with self._lock:
            return len(self._open)

    @contextmanager
    def using(self, name: str, *, create: bool) -> Iterator[FileCommitLog]:
        """The open file log of ``name`` for one operation (UnknownLog if absent and not ``create``).

        Opening reads the whole file: it runs outside the directory's lock, so a large log
        being opened holds up only its own users, never the other logs'."""
        log = self._acquire(name, create)
        try:
            yield log
        finally:
            self._release([name])

    def _release(self, names: Iterable[str]) -> None:
        """The end of one use of each of ``names`` (:meth:`_acquire`'s), under one lock."""
        with self._lock:
            for name in names:
                self._users[name] -= 1
                if not self._users[name]:
                    del self._users[name]
            self._trim()

    def _acquire(self, name: str, create: bool) -> FileCommitLog:
        while True:
            with self._lock:
                log = self._open.get(name)
                if log is not None:
                    self._use(name)
                    return log
                gate = self._opening.setdefault(name, threading.Lock())
            with gate:  # one opener per name; the others wait for it, not for the directory
                with self._lock:
                    if name in self._open or self._opening.get(name) is not gate:
                        continue  # opened meanwhile, or its opener failed: look again
                try:
                    log = FileCommitLog(log_path(self.root, name), sync=self._sync, create=create)
                except BaseException:
                    with self._lock:
                        del self._opening[name]
                    raise
                with self._lock:
                    self._open[name] = log
                    del self._opening[name]
                    self._use(name)
                    return log

    def _use(self, name: str) -> None:
        self._open.move_to_end(name)
        self._users[name] = self._users.get(name, 0) + 1
        self._trim()

    def _trim(self) -> None:
        # Close idle logs, least recently used first; logs in use may overshoot briefly. Called
        # twice per append: under the bound it walks nothing, over it only up to the idle logs
        # it closes (a copy of the whole table per call made an MLC with 2,048 open logs spend
        # ~3x the CPU per record of one with few).
        excess = len(self._open) - self.max_open
        if excess <= 0:
            return
        idle = []
        for name in self._open:
            if name not in self._users:
                idle.append(name)
                if len(idle) == excess:
                    break
        for name in idle:
            self._open.pop(name).close()

    def append_many(self, entries: Sequence[tuple[str, LogRecord, str | None]],
                    bodies: Sequence[bytes | None] | None = None) -> list[str | Exception]:
        """Group commit over the logs named in ``entries`` (``(name, record, if_match)``): each
        answered on its own, as :meth:`DirectoryLog.append` would answer it (the new tag, or
        its exception), with one flush for all (:func:`~sdcp_fast.commitlog.file.append_group`).
        ``bodies``: each record as ``encode_record`` encodes it, where the caller has that
        already (None where not), so it is not encoded again."""
        results: list[str | Exception] = [ValueError("not appended")] * len(entries)
        framed: dict[int, bytes] = {}
        taken: set[str] = set()  # names an earlier entry goes on to append to
        for i, (name, record, if_match) in enumerate(entries):
            try:
                body = None if bodies is None else bodies[i]
                blob = frame(record) if body is None else frame_body(body)
                if name not in taken:
                    _check_unwritten(self, name, if_match)
                framed[i] = blob
                taken.add(name)
            except Exception as exc:
                results[i] = exc
        # Each log is taken for the group and let go of at its end, all under one lock (not a
        # context manager and a lock round per log: a pass's records are on as many logs).
        opened: dict[str, FileCommitLog | Exception] = {}
        try:
            group: list[tuple[FileCommitLog, LogRecord, str | None, bytes]] = []
            where: list[int] = []
            for i, blob in framed.items():
                name, record, if_match = entries[i]
                log = opened.get(name)
                if log is None:
                    try:
                        log = opened[name] = self._acquire(name, True)
                    except Exception as exc:  # e.g. a corrupt log: its entries fail, the others go on
                        log = opened[name] = exc
                if isinstance(log, Exception):
                    results[i] = log
                    continue
                group.append((log, record, if_match, blob))
                where.append(i)
            for i, result in zip(where, append_group(group), strict=True):
                results[i] = result
        finally:
            self._release([name for name, log in opened.items() if not isinstance(log, Exception)])
        return results

    def close(self) -> None:
        with self._lock:
            for log in self._open.values():
                log.close()
            self._open.clear()


def _checked_frame(directory: LogDirectory, name: str, record: LogRecord, if_match: str | None) -> bytes:
    """The record's frame, refusing what cannot be stored before a file exists for it, and a
    tag no log that was never written can match (it holds no fence either: create nothing)."""
    framed = frame(record)
    _check_unwritten(directory, name, if_match)
    return framed


_EMPTY_TAG = etag_of(0)


def _check_unwritten(directory: LogDirectory, name: str, if_match: str | None) -> None:
    # The tag of an empty log matches a log never written: no path hash and stat for it (a
    # session's first append, to a log it read as empty, sends it).
    if if_match is not None and if_match != _EMPTY_TAG and not directory.exists(name) and length_of(if_match) != 0:
        raise PreconditionFailed(f"log has 0 records, not {if_match}")


class DirectoryLog:
    """One log of a :class:`LogDirectory`, as a ``CommitLog``."""

    enforces_fencing: ClassVar[bool] = True

    def __init__(self, directory: LogDirectory, name: str) -> None:
        self.directory = directory
        self.ref = name

    def read(self, start: int = 0) -> LogView:
        try:
            with self.directory.using(self.ref, create=False) as log:
                return log.read(start)
        except UnknownLog:
            return LogView([], start, etag_of(0))

    def read_encoded(self, start: int = 0) -> tuple[str, bytes]:
        """The entity tag and records ``start`` on as stored: one CBOR sequence, not decoded."""
        try:
            with self.directory.using(self.ref, create=False) as log:
                return log.read_encoded(start)
        except UnknownLog:
            return etag_of(0), b""

    def append(self, record: LogRecord, if_match: str | None) -> str:
        framed = _checked_frame(self.directory, self.ref, record, if_match)
        with self.directory.using(self.ref, create=True) as log:
            return log.append(record, if_match, framed=framed)

    def close(self) -> None:
        pass  # the directory owns the descriptors
