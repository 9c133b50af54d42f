"""Records the file log could not read back, recovery that never drops acknowledged records,
and bounded descriptors for many logs."""

from __future__ import annotations

import os

import pytest

from sdcp_fast.commitlog import Fenced, LogCorrupt, RecordTooLarge
from sdcp_fast.commitlog import file as file_log
from sdcp_fast.commitlog.directory import LogDirectory
from sdcp_fast.commitlog.file import _HEADER, MAX_RECORD, FileCommitLog, frame, log_path
from sdcp_fast.protocol.commitlog import CommitRecord, FenceRecord, encode_record


def record(n: int, tokens: int = 1) -> CommitRecord:
    return CommitRecord(1, n, tuple(range(tokens)), n, n.to_bytes(32, "big"))


def test_record_over_the_limit_is_refused_before_anything_is_written(tmp_path, monkeypatch):
    # The same constant bounds what is written and what is read back; a small one keeps
    # the pure-Python encoder fast here.
    monkeypatch.setattr(file_log, "MAX_RECORD", 4096)
    path = str(tmp_path / "big.log")
    big = record(1, tokens=2000)
    assert len(encode_record(big)) > file_log.MAX_RECORD
    with FileCommitLog(path) as log:
        etag = log.append(record(0), '"0"')
        with pytest.raises(RecordTooLarge) as exc:
            log.append(big, etag)
        assert exc.value.status == 413
        log.append(FenceRecord(2), etag)
    with FileCommitLog(path) as log:
        assert log.read().records == [record(0), FenceRecord(2)], "the fence survives a restart"
        with pytest.raises(Fenced):
            log.append(record(2), log.read().etag)


def test_valid_record_after_a_bad_frame_is_corruption_not_a_torn_tail(tmp_path):
    path = str(tmp_path / "corrupt.log")
    with FileCommitLog(path) as log:
        log.append(record(0), None)
    # What the old log wrote for a record over MAX_RECORD, then a fence after it.
    oversized = _HEADER.pack(MAX_RECORD + 1, 0) + b"\x00" * (MAX_RECORD + 1)
    with open(path, "ab") as f:
        f.write(oversized + frame(FenceRecord(2)))
    size = os.path.getsize(path)
    with pytest.raises(LogCorrupt):
        FileCommitLog(path).read()
    assert os.path.getsize(path) == size, "nothing was cut"


def test_flipped_byte_mid_log_is_corruption(tmp_path):
    path = str(tmp_path / "flip.log")
    with FileCommitLog(path) as log:
        for n in range(3):
            log.append(record(n), None)
    data = bytearray(open(path, "rb").read())
    data[len(frame(record(0))) + _HEADER.size + 2] ^= 0xFF  # inside record 1's body
    open(path, "wb").write(bytes(data))
    with pytest.raises(LogCorrupt):
        FileCommitLog(path)
    assert open(path, "rb").read() == bytes(data), "the damaged log is left as it is"


def test_reading_a_missing_log_creates_nothing(tmp_path):
    logs = LogDirectory(str(tmp_path))
    name = "mlc://" + "0" * 32 + "/AAAAAAAAAAAAAAAAAAAAAA/commit_log"
    view = logs.log(name).read()
    assert view.records == [] and view.etag == '"0"'
    assert not logs.exists(name) and not os.path.exists(log_path(str(tmp_path), name))
    logs.close()


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts descriptors through /proc")
def test_descriptors_stay_bounded_over_many_logs(tmp_path):
    logs = LogDirectory(str(tmp_path), max_open=8, sync=False)
    before = _fds()
    for n in range(300):
        log = logs.log(f"mlc://{n:032x}/AAAAAAAAAAAAAAAAAAAAAA/commit_log")
        log.append(record(n), '"0"')
        assert log.read().records == [record(n)]
    assert logs.open_count <= 8
    assert _fds() - before <= 8
    # Closed logs reopen on demand with their records.
    assert logs.log(f"mlc://{0:032x}/AAAAAAAAAAAAAAAAAAAAAA/commit_log").read().records == [record(0)]
    logs.close()
    assert _fds() <= before


def test_http_log_refuses_an_oversized_record_as_record_too_large(http_logs, monkeypatch):
    import sdcp_fast.mlc_server.server as srv
    from sdcp_fast.commitlog import open_commit_log
    from sdcp_fast.commitlog.http import HttpCommitLog

    monkeypatch.setattr(srv, "MAX_RECORD", 4096)
    ref = f"{http_logs}/logs/{bytes(16).hex()}/{'A' * 22}/commit_log"
    log = HttpCommitLog(ref, http1=True) if http_logs.http1 else open_commit_log(ref)
    with pytest.raises(RecordTooLarge) as exc:
        log.append(record(1, tokens=2000), '"0"')
    assert exc.value.status == 413
    assert log.read().records == [] and log.read().etag == '"0"', "nothing was written"
    log.close()


def test_records_are_not_held_decoded_in_memory(tmp_path):
    import gc
    import weakref

    path = str(tmp_path / "big-records.log")
    with FileCommitLog(path, sync=False) as log:
        appended = CommitRecord(1, 0, tuple(range(1000, 21000)), 0, bytes(32))
        log.append(appended, None)
        view = log.read()
        assert view.records == [appended]
        held = [weakref.ref(appended), weakref.ref(view.records[0])]
        del appended, view
        gc.collect()
        assert [ref() for ref in held] == [None, None], "the log keeps records it wrote or read"
        with FileCommitLog(path, sync=False) as again:  # and what it parsed on open
            read = again.read().records[0]
            ref = weakref.ref(read)
            del read
            gc.collect()
            assert ref() is None


def test_a_log_holds_a_bounded_number_of_records(tmp_path, monkeypatch):
    from sdcp_fast.commitlog import LogFull

    monkeypatch.setattr(file_log, "MAX_RECORDS", 3)
    with FileCommitLog(str(tmp_path / "bounded.log"), sync=False) as log:
        etag = None
        for n in range(3):
            etag = log.append(record(n), etag)
        with pytest.raises(LogFull) as exc:
            log.append(record(3), etag)
        assert exc.value.status == 507
        assert len(log.read().records) == 3, "nothing was written"


@pytest.mark.parametrize("short", [True, False])
def test_a_full_file_system_is_507_and_leaves_no_part_of_the_record(tmp_path, monkeypatch, short):
    import errno

    from sdcp_fast.commitlog import LogFull

    path = str(tmp_path / "full.log")
    with FileCommitLog(path, sync=False) as log:
        etag = log.append(record(0), None)
        size = os.path.getsize(path)

        class FullOs:
            def __getattr__(self, name: str):
                return getattr(os, name)

            def write(self, fd: int, data: bytes) -> int:
                if short:  # what fits, then ENOSPC on the next write
                    return os.write(fd, data[: len(data) // 2])
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        monkeypatch.setattr(file_log, "os", FullOs())
        with pytest.raises(LogFull) as exc:
            log.append(record(1), etag)
        assert exc.value.status == 507
        monkeypatch.undo()
        assert os.path.getsize(path) == size
        assert log.append(record(1), etag) == '"2"', "the log takes appends once there is room"
    with FileCommitLog(path) as log:
        assert log.read().records == [record(0), record(1)]
