"""The embedded commit log: one append-only file per log, fsync'd before an append is
acknowledged.

Each record is framed as ``length (4 bytes BE) | crc32 (4 bytes BE) | CBOR record``. A frame
that is short or fails its checksum can only be the tail of an append that never returned
(acknowledgement follows fsync); it is ignored on open and cut off by the next writer.
Writers in several threads and processes take ``flock`` on the file around check-and-append,
so the tag check and the fence check are atomic with the write.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import struct
import threading
import zlib

from sdcp_fast.commitlog.base import LogView, PreconditionFailed, etag_of, fence_error, length_of
from sdcp_fast.protocol.commitlog import FenceRecord, LogRecord, decode_record, encode_record

_HEADER = struct.Struct(">II")
MAX_RECORD = 1 << 24


def log_path(root: str, name: str) -> str:
    """Where the embedded MLC keeps the log called ``name`` (an mlc:// URI)."""
    digest = hashlib.blake2b(name.encode(), digest_size=16).hexdigest()
    return os.path.join(root, "logs", f"{digest}.log")


def frame(record: LogRecord) -> bytes:
    body = encode_record(record)
    return _HEADER.pack(len(body), zlib.crc32(body)) + body


class FileCommitLog:
    def __init__(self, path: str, *, sync: bool = True) -> None:
        self.path = path
        self.ref = "file://" + os.path.abspath(path)
        self._sync = sync
        directory = os.path.dirname(os.path.abspath(path))
        os.makedirs(directory, exist_ok=True)
        created = not os.path.exists(path)
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        if created and sync:
            dfd = os.open(directory, os.O_RDONLY)
            try:
                os.fsync(dfd)  # the file's name must survive a crash too
            finally:
                os.close(dfd)
        self._lock = threading.Lock()
        self._records: list[LogRecord] = []
        self._end = 0  # byte offset just past the last whole record
        self._fence = 0
        with self._lock:
            self._locked(fcntl.LOCK_SH, truncate=False)

    # The in-memory copy is refreshed from the file under flock, so appends by other
    # processes (or other FileCommitLog objects) are seen before every check.
    def _locked(self, mode: int, *, truncate: bool) -> None:
        fcntl.flock(self._fd, mode)
        try:
            self._refresh(truncate=truncate)
        finally:
            if mode == fcntl.LOCK_SH:
                fcntl.flock(self._fd, fcntl.LOCK_UN)

    def _refresh(self, *, truncate: bool) -> None:
        size = os.fstat(self._fd).st_size
        if size < self._end:
            raise RuntimeError(f"{self.path} shrank below acknowledged records")
        if size == self._end:
            return
        data = os.pread(self._fd, size - self._end, self._end)
        pos = 0
        while pos + _HEADER.size <= len(data):
            n, crc = _HEADER.unpack_from(data, pos)
            body = data[pos + _HEADER.size: pos + _HEADER.size + n]
            if n > MAX_RECORD or len(body) < n or zlib.crc32(body) != crc:
                break
            record = decode_record(bytes(body))
            self._records.append(record)
            if isinstance(record, FenceRecord):
                self._fence = max(self._fence, record.epoch)
            pos += _HEADER.size + n
        self._end += pos
        if truncate and self._end < size:
            os.ftruncate(self._fd, self._end)  # torn tail of a writer that died mid-append

    def read(self, start: int = 0) -> LogView:
        with self._lock:
            self._locked(fcntl.LOCK_SH, truncate=False)
            return LogView(self._records[start:], start, etag_of(len(self._records)))

    def append(self, record: LogRecord, if_match: str | None) -> str:
        blob = frame(record)
        with self._lock:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            try:
                self._refresh(truncate=True)
                # Fencing first: a fenced writer must stop, not re-read and retry.
                if record.epoch < self._fence:
                    raise fence_error(self._fence, record)
                if if_match is not None and length_of(if_match) != len(self._records):
                    raise PreconditionFailed(f"log has {len(self._records)} records, not {if_match}")
                written = os.write(self._fd, blob)
                if written != len(blob):
                    os.ftruncate(self._fd, self._end)
                    raise OSError(f"short write to {self.path}")
                if self._sync:
                    os.fdatasync(self._fd)
                self._end += len(blob)
                self._records.append(record)
                if isinstance(record, FenceRecord):
                    self._fence = max(self._fence, record.epoch)
                return etag_of(len(self._records))
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1

    def __enter__(self) -> FileCommitLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
