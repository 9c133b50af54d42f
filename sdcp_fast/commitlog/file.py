"""The embedded commit log: one append-only file per log, fsync'd before an append is
acknowledged.

Each record is framed as ``length (4 bytes BE) | crc32 (4 bytes BE) | CBOR record``; a record
over ``MAX_RECORD`` bytes is refused before anything is written, so every acknowledged
frame reads back. Recovery walks the frames by their lengths and never looks inside a
record's bytes, so a payload that happens to contain a whole frame (a digest, a token array)
cannot be mistaken for one. Every writer cuts a torn tail before it writes, so at most one
unacknowledged frame ever follows the last whole record; what follows it is:

- a prefix of a frame (a header cut short, or a length reaching past the end of the file),
  or a whole-length frame failing its checksum that ends exactly at the end of the file, or
  zeros (a file extended but never written): the tail of an append that never returned
  (acknowledgement follows fsync). It is ignored on open and cut off by the next writer;
- anything else (a bad frame with bytes after it, a checksum-valid frame that does not
  decode, a header whose length no writer could have written followed by non-zero bytes):
  corruption, not a crash. The log refuses to serve (``LogCorrupt``) rather than drop
  acknowledged records, a fence among them.

Writers in several threads and processes take ``flock`` on the file around check-and-append,
so the tag check and the fence check are atomic with the write. :func:`append_group` is group
commit: the appends to several logs checked and written, then flushed together (one
``syncfs`` where that is cheaper than a ``fdatasync`` per log), each answered on its own.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import hashlib
import os
import struct
import threading
import zlib
from array import array
from collections.abc import Callable, Sequence
from typing import ClassVar, cast

from sdcp_fast.commitlog.backend import (
    LogCorrupt,
    LogFull,
    LogView,
    PreconditionFailed,
    RecordTooLarge,
    UnknownLog,
    etag_of,
    fence_error,
    length_of,
)
from sdcp_fast.protocol.commitlog import FenceRecord, LogRecord, decode_record, encode_record
from sdcp_fast.protocol.problems import SdcpProblem

_HEADER = struct.Struct(">II")
MAX_RECORD = 1 << 24
# Bounds of one log: a session commits one record per round, far below either; a writer
# past them gets LogFull (507) rather than a log whose offsets or file grow without end.
MAX_RECORDS = 1 << 20
MAX_LOG_BYTES = 1 << 32


def log_path(root: str, name: str) -> str:
    """Where the embedded MLC keeps the log called ``name`` (an mlc:// URI)."""
    digest = hashlib.blake2b(name.encode(), digest_size=16).hexdigest()
    return os.path.join(root, "logs", f"{digest}.log")


def frame(record: LogRecord) -> bytes:
    return frame_body(encode_record(record))


def frame_body(body: bytes) -> bytes:
    """The frame of a record encoded as ``encode_record`` encodes it (RecordTooLarge past the limit)."""
    if len(body) > MAX_RECORD:
        raise RecordTooLarge(f"record of {len(body)} bytes; a file log holds records up to {MAX_RECORD}",
                             extra={"limit": MAX_RECORD})
    return _HEADER.pack(len(body), zlib.crc32(body)) + body


def _frame_at(data: bytes, pos: int) -> LogRecord | None:
    """The record framed at ``pos``, or None when no whole, checksum-valid record is there."""
    if pos + _HEADER.size > len(data):
        return None
    n, crc = _HEADER.unpack_from(data, pos)
    end = pos + _HEADER.size + n
    if not 0 < n <= MAX_RECORD or end > len(data):
        return None
    body = data[pos + _HEADER.size: end]
    if zlib.crc32(body) != crc:
        return None
    try:
        return decode_record(bytes(body))
    except SdcpProblem:
        return None


def _torn(data: bytes, pos: int) -> bool:
    """Whether ``data[pos:]``, which holds no whole record at ``pos``, is the tail of one
    append that never returned (see the module's docstring) rather than damage."""
    if pos + _HEADER.size > len(data):
        return True  # the header itself was cut short
    n, crc = _HEADER.unpack_from(data, pos)
    if not 0 < n <= MAX_RECORD:
        return data.count(0, pos) == len(data) - pos  # only zeros: never written
    end = pos + _HEADER.size + n
    if end > len(data):
        return True  # cut short inside the body, whatever the body's bytes look like
    # The whole length is there: torn only if it failed its checksum (unwritten blocks)
    # and nothing follows it; a checksum-valid frame that does not decode was written so.
    return end == len(data) and zlib.crc32(data[pos + _HEADER.size: end]) != int(crc)


class FileCommitLog:
    enforces_fencing: ClassVar[bool] = True
    max_record = MAX_RECORD

    def __init__(self, path: str, *, sync: bool = True, create: bool = True) -> None:
        self.path = path
        self.ref = "file://" + os.path.abspath(path)
        self._sync = sync
        directory = os.path.dirname(os.path.abspath(path))
        # Opened with no stat first and no makedirs while the folder is there: a new log (one a
        # session) costs one system call to open, not four.
        flags = os.O_RDWR | os.O_APPEND
        try:
            self._fd = os.open(path, flags | os.O_CREAT if create else flags, 0o644)
        except FileNotFoundError:
            if not create:
                raise UnknownLog(f"no commit log at {path}") from None
            os.makedirs(directory, exist_ok=True)  # the folder of logs is new too
            self._fd = os.open(path, flags | os.O_CREAT, 0o644)
        # The file's name must survive a crash too, before any record in it is acknowledged. The
        # flush of the first record makes it so (a syncfs covers it, else the folder is fsync'd
        # once for all the group's new logs): no folder fsync per log created. Until a record is
        # in the file, whoever created it, its folder is still to be flushed.
        self._folder: str | None = directory if sync else None
        self._dev = os.fstat(self._fd).st_dev
        self._lock = threading.Lock()
        # Where each record's frame starts: records are read back from the file when asked
        # for, never held decoded (a 16 MiB record decodes to ~225 MB of Python objects).
        self._offsets = array("Q")
        self._end = 0  # byte offset just past the last whole record
        self._fence = 0
        try:
            with self._lock:
                self._locked(fcntl.LOCK_SH, truncate=False)
        except BaseException:
            self.close()
            raise
        if self._offsets:
            self._folder = None  # a record was flushed in it, so its name was made durable then

    # The in-memory copy is refreshed from the file under flock, so appends by other
    # processes (or other FileCommitLog objects) are seen before every check.
    def _locked(self, mode: int, *, truncate: bool) -> None:
        if self._fd < 0:
            raise ValueError(f"{self.path} is closed")
        fcntl.flock(self._fd, mode)
        try:
            self._refresh(truncate=truncate)
        finally:
            if mode == fcntl.LOCK_SH:
                fcntl.flock(self._fd, fcntl.LOCK_UN)

    def _refresh(self, *, truncate: bool) -> None:
        size = os.fstat(self._fd).st_size
        if size < self._end:
            raise LogCorrupt(f"{self.path} shrank below acknowledged records")
        if size == self._end:
            return
        data = os.pread(self._fd, size - self._end, self._end)
        pos = 0
        while pos < len(data):
            record = _frame_at(data, pos)
            if record is None:
                break
            self._offsets.append(self._end + pos)
            if isinstance(record, FenceRecord):
                self._fence = max(self._fence, record.epoch)
            pos += _HEADER.size + _HEADER.unpack_from(data, pos)[0]
        if pos < len(data) and not _torn(data, pos):
            # Not the tail of an unacknowledged append: acknowledged data is damaged, so
            # stop instead of reading past or cutting it.
            raise LogCorrupt(f"{self.path}: bad frame at byte {self._end + pos} of {size}")
        self._end += pos
        if truncate and self._end < size:
            os.ftruncate(self._fd, self._end)  # torn tail of a writer that died mid-append

    def _bodies(self, start: int) -> tuple[str, list[memoryview]]:
        """The entity tag and the CBOR bodies of records ``start`` on, read from the file."""
        with self._lock:
            self._locked(fcntl.LOCK_SH, truncate=False)
            etag, count, end = etag_of(len(self._offsets)), len(self._offsets), self._end
            if start >= count:
                return etag, []
            first = self._offsets[start]
            data = memoryview(os.pread(self._fd, end - first, first))
        out, pos = [], 0
        while pos < len(data):
            n = _HEADER.unpack_from(data, pos)[0]
            out.append(data[pos + _HEADER.size: pos + _HEADER.size + n])
            pos += _HEADER.size + n
        return etag, out

    def read(self, start: int = 0) -> LogView:
        etag, bodies = self._bodies(start)
        return LogView([decode_record(bytes(b)) for b in bodies], start, etag)

    def read_encoded(self, start: int = 0) -> tuple[str, bytes]:
        """The entity tag and records ``start`` on as one CBOR sequence, as stored (nothing
        is decoded: what the MLC server sends for ``GET /logs``)."""
        etag, bodies = self._bodies(start)
        return etag, b"".join(bodies)

    def append(self, record: LogRecord, if_match: str | None, *, framed: bytes | None = None) -> str:
        """``framed``: ``frame(record)`` where the caller has it already (encoding a large
        record takes seconds)."""
        blob = frame(record) if framed is None else framed
        result = append_group([(self, record, if_match, blob)])[0]
        if isinstance(result, Exception):
            raise result
        return result

    def _hold(self) -> None:
        """This log held against every other writer, in this process (its lock) and in others
        (``flock``), until :meth:`_let_go`."""
        self._lock.acquire()
        try:
            if self._fd < 0:
                raise ValueError(f"{self.path} is closed")
            fcntl.flock(self._fd, fcntl.LOCK_EX)
        except BaseException:
            self._lock.release()
            raise

    def _let_go(self) -> None:
        try:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        finally:
            self._lock.release()

    def _write(self, record: LogRecord, if_match: str | None, blob: bytes) -> str:
        """Check ``record`` against the log as it is now (held since :func:`append_group` read
        it again: :meth:`_hold`) and write its frame, not yet flushed: the caller flushes before
        anyone learns of it."""
        # Fencing first: a fenced writer must stop, not re-read and retry.
        if record.epoch < self._fence:
            raise fence_error(self._fence, record)
        count = len(self._offsets)
        # The tag as this log writes it is the common case: a string compare, not a parse.
        if if_match is not None and if_match != etag_of(count) and length_of(if_match) != count:
            raise PreconditionFailed(f"log has {count} records, not {if_match}")
        if count >= MAX_RECORDS or self._end + len(blob) > MAX_LOG_BYTES:
            raise LogFull(f"{self.path} holds {count} records in {self._end} bytes; at most "
                          f"{MAX_RECORDS} records and {MAX_LOG_BYTES} bytes",
                          extra={"max_records": MAX_RECORDS, "max_bytes": MAX_LOG_BYTES})
        try:
            written = os.write(self._fd, blob)
            if written != len(blob):  # what a file system out of room does first
                raise OSError(errno.ENOSPC, f"short write to {self.path}")
        except OSError as exc:
            os.ftruncate(self._fd, self._end)  # not acknowledged: leave no part of it
            raise self._write_error(exc, f"{len(blob)} more bytes of") from None
        self._offsets.append(self._end)
        self._end += len(blob)
        if isinstance(record, FenceRecord):
            self._fence = max(self._fence, record.epoch)
        return etag_of(len(self._offsets))

    def _write_error(self, exc: OSError, what: str) -> Exception:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return LogFull(f"no room on the file system for {what} {self.path}")
        return exc

    def _mark(self) -> tuple[int, int, int]:
        return len(self._offsets), self._end, self._fence

    def _undo(self, mark: tuple[int, int, int]) -> None:
        """Forget the frames written since ``mark``: their flush failed, so none is acknowledged."""
        count, end, fence = mark
        os.ftruncate(self._fd, end)
        del self._offsets[count:]
        self._end, self._fence = end, fence

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1

    def __enter__(self) -> FileCommitLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# From this many logs in one group, one syncfs(2) of their file system costs less than a
# fdatasync of each: after writes to 64 logs on ext4, one syncfs took 0.8-22 ms where their
# 64 fdatasyncs took 9.4-518 ms (docs/measurements.md, "Group commit").
SYNCFS_FROM = 4


def _syncfs() -> Callable[[int], int] | None:
    """libc's ``syncfs`` where the kernel reports writeback errors through it (Linux 5.8+)."""
    try:
        major, minor = (int(x) for x in os.uname().release.split(".")[:2])
        fn = ctypes.CDLL(None, use_errno=True).syncfs
    except (AttributeError, OSError, ValueError):
        return None
    if (major, minor) < (5, 8):
        return None  # before 5.8 syncfs answered 0 even when writeback failed
    fn.argtypes = [ctypes.c_int]
    return cast(Callable[[int], int], fn)


_SYNCFS = _syncfs()


def append_group(entries: Sequence[tuple[FileCommitLog, LogRecord, str | None, bytes]]) -> list[str | Exception]:
    """Group commit: each ``(log, record, if_match, frame)`` checked and written as
    :meth:`FileCommitLog.append` would, then one flush for all of them, then the answers.

    Each entry is answered on its own: its log's new tag, or the exception its append would
    raise (a fence, a stale tag, a full log), whatever the other entries got. Entries on one
    log are applied in their order (the second sees the first). Every log of the group is held
    (:meth:`FileCommitLog._hold`, taken in path order so two groups cannot deadlock) from
    its check until its frames are flushed, so no reader sees a record that is not durable.
    The flush is a ``fdatasync`` per log, or from ``SYNCFS_FROM`` logs on one file system a
    single ``syncfs``; a log whose flush fails has its frames of this group cut back and its
    entries answered with the failure."""
    results: list[str | Exception] = [ValueError("not appended")] * len(entries)
    by_path: dict[str, FileCommitLog] = {}
    for i, (log, *_) in enumerate(entries):
        if by_path.setdefault(log.ref, log) is not log:  # ref: the absolute path
            # A second handle's flock would wait for the first one's, in this same thread.
            results[i] = ValueError(f"two handles on {log.path} in one group commit")
    held: list[FileCommitLog] = []
    marks: dict[int, tuple[int, int, int]] = {}
    try:
        for _, log in sorted(by_path.items()):
            try:
                log._hold()
            except Exception as exc:  # closed: its entries fail, the others go on
                _fail_entries(entries, results, log, exc)
                continue
            held.append(log)
            try:
                # What another writer appended since this handle last looked, read in before the
                # mark: a flush that fails cuts back to the mark, so never past their records.
                log._refresh(truncate=True)
            except Exception as exc:  # damaged: its entries fail, the others go on
                _fail_entries(entries, results, log, exc)
                continue
            marks[id(log)] = log._mark()
        written: list[int] = []
        for i, (log, record, if_match, blob) in enumerate(entries):
            if id(log) not in marks:
                continue
            try:
                results[i] = log._write(record, if_match, blob)
                written.append(i)
            except Exception as exc:
                results[i] = exc
        failed = _flush([log for log in held if id(log) in marks and log._mark() != marks[id(log)]])
        for log in failed:
            log._undo(marks[id(log)])
        for i in written:
            if entries[i][0] in failed:
                results[i] = failed[entries[i][0]]
    finally:
        for log in reversed(held):
            log._let_go()
    return results


def _fail_entries(entries: Sequence[tuple[FileCommitLog, LogRecord, str | None, bytes]],
                  results: list[str | Exception], log: FileCommitLog, exc: Exception) -> None:
    for i, (other, *_) in enumerate(entries):
        if other is log:
            results[i] = exc


def _flush(logs: list[FileCommitLog]) -> dict[FileCommitLog, Exception]:
    """Make the frames written to ``logs`` durable, and the names of the logs among them that
    held no record before; the logs whose flush failed, with why."""
    synced = [log for log in logs if log._sync]
    if not synced:
        return {}
    if _SYNCFS is not None and len(synced) >= SYNCFS_FROM:
        if len({log._dev for log in synced}) == 1 and _SYNCFS(synced[0]._fd) == 0:
            for log in synced:
                log._folder = None  # the whole file system is durable, names included
            return {}
        # Another file system among them, or syncfs failed: flush each, so that each log
        # learns its own outcome.
    failed: dict[FileCommitLog, Exception] = {}
    for log in synced:
        try:
            os.fdatasync(log._fd)
        except OSError as exc:
            failed[log] = log._write_error(exc, "the frames just written to")
    named: dict[str, list[FileCommitLog]] = {}
    for log in synced:
        if log._folder is not None and log not in failed:
            named.setdefault(log._folder, []).append(log)
    for folder, new in named.items():  # one fsync per folder, however many logs it gained
        try:
            _fsync_folder(folder)
        except OSError as exc:
            for log in new:
                failed[log] = log._write_error(exc, "the folder of")
            continue
        for log in new:
            log._folder = None
    return failed


def _fsync_folder(folder: str) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
