"""Group commit (§6.8 appends to several logs at once), against every backend that has one:
each entry is checked (fence first, then tag) and answered on its own, whatever the others
got; and, for file logs, one flush for the group, taken before any answer and before any
reader can see the records."""

from __future__ import annotations

import errno
import itertools
import os
import stat
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack
from typing import Any

import pytest

from sdcp_fast.commitlog import Fenced, LogFull, PreconditionFailed, RecordTooLarge
from sdcp_fast.commitlog import file as file_log
from sdcp_fast.commitlog.file import FileCommitLog, append_group, frame
from sdcp_fast.protocol.commitlog import CommitRecord, FenceRecord, LogRecord

Batch = Callable[[Sequence[tuple[Any, LogRecord, "str | None"]]], list["str | Exception"]]
_names = itertools.count()


def commit(epoch: int, round_: int) -> CommitRecord:
    return CommitRecord(epoch=epoch, round=round_, emitted=(round_, 7), committed=2 * round_,
                        digest=bytes([round_ % 256]) * 32)


@pytest.fixture(params=["file", "mlc", "http2", "http1", pytest.param("etcd", marks=pytest.mark.services)])
def grouped(request, tmp_path) -> Iterator[tuple[Callable[[], Any], Batch]]:
    """(a function opening a fresh log, the backend's group append over such logs)."""
    stack = ExitStack()
    opened: list[Any] = []
    if request.param == "file":
        def make() -> Any:
            return FileCommitLog(str(tmp_path / f"{next(_names)}.log"))

        def batch(entries):
            return append_group([(log, record, tag, frame(record)) for log, record, tag in entries])
    elif request.param == "mlc":
        from sdcp_fast.commitlog.directory import LogDirectory

        directory = LogDirectory(str(tmp_path), max_open=2)  # fewer than a batch's logs
        stack.callback(directory.close)

        def make() -> Any:
            return directory.log(f"mlc://{bytes(16).hex()}/{next(_names):022d}/commit_log")

        def batch(entries):
            return directory.append_many([(log.ref, record, tag) for log, record, tag in entries])
    elif request.param in ("http2", "http1"):
        from sdcp_fast.commitlog.http import HttpCommitLog, append_batch
        from tests.commitlog.conftest import _served_logs

        base = stack.enter_context(_served_logs(tmp_path, request.param == "http2"))

        def make() -> Any:
            return HttpCommitLog(f"{base}/logs/{bytes(16).hex()}/{next(_names):022d}/commit_log",
                                 http1=request.param == "http1")

        def batch(entries):
            first = entries[0][0]
            return first._run(append_batch([(log.aio, record, tag) for log, record, tag in entries]))
    else:
        from sdcp_fast.commitlog import open_commit_log
        from sdcp_fast.commitlog.etcd import append_many

        host, port = request.getfixturevalue("etcd_endpoint")

        def make() -> Any:
            return open_commit_log(f"etcd://{host}:{port}/sdcp-group/{os.getpid()}/{next(_names)}")

        def batch(entries):
            return append_many(list(entries))

    def tracked() -> Any:
        log = make()
        opened.append(log)
        return log

    yield tracked, batch
    for log in opened:
        log.close()
    stack.close()


def _kinds(results: list[str | Exception]) -> list[str]:
    return [r if isinstance(r, str) else type(r).__name__ for r in results]


def test_each_entry_is_answered_on_its_own(grouped):
    make, batch = grouped
    fenced, moved, fresh, unconditional, twice = (make() for _ in range(5))
    fenced.append(commit(1, 1), '"0"')
    fenced.append(FenceRecord(3), None)
    moved.append(commit(1, 1), '"0"')
    results = batch([
        (fenced, commit(1, 2), '"2"'),  # its tag is current, but a fence is above its epoch
        (moved, commit(1, 1), '"0"'),  # another append since the tag
        (fresh, commit(1, 1), '"0"'),
        (unconditional, FenceRecord(2), None),
        (twice, commit(1, 1), '"0"'),
        (twice, commit(1, 2), '"1"'),  # the second sees the first
        (fenced, commit(2, 2), "nonsense"),  # a fence answers first, whatever the tag
    ])
    assert _kinds(results) == ["Fenced", "PreconditionFailed", '"1"', '"1"', '"1"', '"2"', "Fenced"]
    assert results[0].status == 409 and results[0].extra["fence"] == 3  # type: ignore[union-attr]
    assert fenced.read().records == [commit(1, 1), FenceRecord(3)]
    assert moved.read().records == [commit(1, 1)]
    assert fresh.read().records == [commit(1, 1)]
    assert unconditional.read().records == [FenceRecord(2)]
    assert twice.read().records == [commit(1, 1), commit(1, 2)]
    # and the logs take their next single appends as usual
    assert fresh.append(commit(1, 2), '"1"') == '"2"'
    with pytest.raises(Fenced):
        fenced.append(commit(2, 3), '"2"')


def test_a_record_too_large_fails_only_its_entry(grouped, monkeypatch):
    make, batch = grouped
    small, large = make(), make()
    limit = getattr(large, "max_record", None) or file_log.MAX_RECORD
    if limit > 1 << 20:
        pytest.skip("a record over the 16 MiB file limit takes seconds to encode: "
                    "test_a_record_over_the_file_limit_is_refused_before_the_group lowers the limit instead")
    huge = CommitRecord(epoch=1, round=1, emitted=tuple(range(limit // 2)), committed=limit // 2, digest=bytes(32))
    results = batch([(large, huge, '"0"'), (small, commit(1, 1), '"0"')])
    assert isinstance(results[0], RecordTooLarge) and results[1] == '"1"'
    assert large.read().records == [] and small.read().records == [commit(1, 1)]


# -- file logs: one flush, before any answer or reader -------------------------------------------


class _Flushes:
    def __init__(self, monkeypatch: pytest.MonkeyPatch, fail: set[int] | None = None, code: int = errno.EIO) -> None:
        self.fdatasync: list[int] = []
        self.syncfs: list[int] = []
        self.fail = fail or set()
        real = os.fdatasync

        def fdatasync(fd: int) -> None:
            self.fdatasync.append(fd)
            if fd in self.fail:
                raise OSError(code, os.strerror(code))
            real(fd)

        def syncfs(fd: int) -> int:
            self.syncfs.append(fd)
            os.sync()
            return 0

        monkeypatch.setattr(file_log.os, "fdatasync", fdatasync)
        monkeypatch.setattr(file_log, "_SYNCFS", syncfs)


def _logs(tmp_path, n: int) -> list[FileCommitLog]:
    return [FileCommitLog(str(tmp_path / f"{i}.log")) for i in range(n)]


def _group(entries):
    return append_group([(log, record, tag, frame(record)) for log, record, tag in entries])


def test_a_group_of_many_logs_is_flushed_once(tmp_path, monkeypatch):
    flushes = _Flushes(monkeypatch)
    logs = _logs(tmp_path, file_log.SYNCFS_FROM + 2)
    assert _group([(log, commit(1, 1), '"0"') for log in logs]) == ['"1"'] * len(logs)
    assert (len(flushes.syncfs), flushes.fdatasync) == (1, [])


def test_a_small_group_flushes_each_log_once(tmp_path, monkeypatch):
    flushes = _Flushes(monkeypatch)
    a, b = _logs(tmp_path, 2)
    assert _group([(a, commit(1, 1), '"0"'), (a, commit(1, 2), '"1"'), (b, commit(1, 1), '"0"')]) == [
        '"1"', '"2"', '"1"']
    assert sorted(flushes.fdatasync) == sorted([a._fd, b._fd]) and flushes.syncfs == []


def test_a_group_with_nothing_written_flushes_nothing(tmp_path, monkeypatch):
    flushes = _Flushes(monkeypatch)
    a, b = _logs(tmp_path, 2)
    a.append(FenceRecord(2), None)
    flushes.fdatasync.clear()
    assert _kinds(_group([(a, commit(1, 1), '"1"'), (b, commit(1, 1), '"5"')])) == ["Fenced", "PreconditionFailed"]
    assert flushes.fdatasync == [] and flushes.syncfs == []


@pytest.mark.parametrize(("code", "answer"), [(errno.EIO, OSError), (errno.ENOSPC, LogFull)])
def test_a_failed_flush_fails_and_cuts_back_only_its_logs_entries(tmp_path, monkeypatch, code, answer):
    a, b = _logs(tmp_path, 2)
    a.append(commit(1, 1), '"0"')
    before = os.path.getsize(a.path)
    _Flushes(monkeypatch, fail={a._fd}, code=code)
    results = _group([(a, commit(1, 2), '"1"'), (b, commit(1, 1), '"0"'), (a, commit(1, 3), '"2"')])
    assert type(results[0]) is answer and type(results[2]) is answer and results[1] == '"1"'
    assert os.path.getsize(a.path) == before, "no frame of an unflushed entry stays"
    assert FileCommitLog(a.path).read().records == [commit(1, 1)]
    assert b.read().records == [commit(1, 1)]
    monkeypatch.undo()
    assert a.append(commit(1, 2), '"1"') == '"2"', "the log takes appends again"


def test_no_reader_sees_a_grouped_record_before_it_is_flushed(tmp_path, monkeypatch):
    """Each log of a group stays locked from its check until its flush returned: a reader (in
    another process it would be the router) waits, then sees the durable record."""
    a, b = _logs(tmp_path, 2)
    reader = FileCommitLog(a.path)
    seen: list[list[LogRecord]] = []
    during: list[bool] = []
    real = os.fdatasync

    def fdatasync(fd: int) -> None:
        if fd == a._fd and not during:
            t = threading.Thread(target=lambda: seen.append(reader.read().records))
            t.start()
            t.join(0.3)
            during.append(t.is_alive())  # still waiting on the log's lock
            threading.Thread(target=t.join).start()
        real(fd)

    monkeypatch.setattr(file_log.os, "fdatasync", fdatasync)
    assert _group([(a, commit(1, 1), '"0"'), (b, commit(1, 1), '"0"')]) == ['"1"', '"1"']
    for _ in range(100):
        if seen:
            break
        threading.Event().wait(0.02)
    assert during == [True] and seen == [[commit(1, 1)]]
    reader.close()


def test_a_closed_log_fails_its_entries_only(tmp_path):
    a, b = _logs(tmp_path, 2)
    a.close()
    results = _group([(a, commit(1, 1), '"0"'), (b, commit(1, 1), '"0"')])
    assert isinstance(results[0], ValueError) and results[1] == '"1"'


def test_a_record_over_the_file_limit_is_refused_before_the_group(tmp_path, monkeypatch):
    """The directory frames each record first: one too large is its entry's 413, and the rest
    of the group is appended."""
    from sdcp_fast.commitlog.directory import LogDirectory

    monkeypatch.setattr(file_log, "MAX_RECORD", 64)
    directory = LogDirectory(str(tmp_path))
    big = CommitRecord(epoch=1, round=1, emitted=tuple(range(40)), committed=40, digest=bytes(32))
    names = [f"mlc://{bytes(16).hex()}/{i:022d}/commit_log" for i in range(2)]
    results = directory.append_many([(names[0], big, '"0"'), (names[1], FenceRecord(1), '"0"')])
    assert isinstance(results[0], RecordTooLarge) and results[1] == '"1"'
    assert not directory.exists(names[0]), "nothing is created for a refused record"
    with pytest.raises(PreconditionFailed):
        directory.log(names[1]).append(FenceRecord(1), '"0"')
    directory.close()


@pytest.mark.services
def test_etcd_appends_to_many_logs_in_few_transactions(etcd_endpoint, monkeypatch):
    """A batch whose entries all hold goes as combined transactions (at most TXN_ENTRIES logs
    each); one fenced log among them sends that chunk's entries one by one, answered alone."""
    from sdcp_fast.commitlog import open_commit_log
    from sdcp_fast.commitlog.etcd import TXN_ENTRIES, EtcdGateway, append_many

    host, port = etcd_endpoint
    sent: list[int] = []
    real = EtcdGateway.call_many

    def call_many(self, path, bodies):
        sent.append(len(bodies))
        return real(self, path, bodies)

    monkeypatch.setattr(EtcdGateway, "call_many", call_many)
    logs = [open_commit_log(f"etcd://{host}:{port}/sdcp-txn/{os.getpid()}/{next(_names)}") for _ in range(TXN_ENTRIES + 5)]
    try:
        assert append_many([(log, commit(1, 1), '"0"') for log in logs]) == ['"1"'] * len(logs)
        assert sent == [2], "two combined transactions, nothing sent alone"
        logs[3].append(FenceRecord(2), None)
        sent.clear()
        results = append_many([(log, commit(1, 2), '"1"') for log in logs])
        assert _kinds(results) == ['"2"'] * 3 + ["Fenced"] + ['"2"'] * (len(logs) - 4)
        assert sent == [2, TXN_ENTRIES], "the chunk holding the fenced log, sent again entry by entry"
        assert [log.read().records for log in logs[2:5]] == [
            [commit(1, 1), commit(1, 2)], [commit(1, 1), FenceRecord(2)], [commit(1, 1), commit(1, 2)]]
    finally:
        for log in logs:
            log.close()


def test_two_handles_on_one_file_in_a_group_fail_the_second_not_the_thread(tmp_path):
    """Each handle takes its own flock: a second handle on a log already held by the group
    would wait for it forever, so its entries are refused instead."""
    a, b = _logs(tmp_path, 2)
    again = FileCommitLog(a.path)
    results = _group([(a, commit(1, 1), '"0"'), (again, commit(1, 2), '"1"'), (b, commit(1, 1), '"0"')])
    assert results[0] == '"1"' and isinstance(results[1], ValueError) and results[2] == '"1"'
    assert again.read().records == [commit(1, 1)]
    again.close()


# -- file logs: a new log's name is durable before its first record is answered -----------------


class _FolderSyncs:
    """The folders fsync'd (a log's name is durable once its folder is), counted by path."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, fail: bool = False) -> None:
        self.folders: list[str] = []
        self.fail = fail
        real = os.fsync

        def fsync(fd: int) -> None:
            if stat.S_ISDIR(os.fstat(fd).st_mode):
                self.folders.append(os.readlink(f"/proc/self/fd/{fd}"))
                if self.fail:
                    raise OSError(errno.EIO, os.strerror(errno.EIO))
            real(fd)

        monkeypatch.setattr(file_log.os, "fsync", fsync)


def _new_names(n: int) -> list[str]:
    return [f"mlc://{bytes(16).hex()}/{next(_names):022d}/commit_log" for _ in range(n)]


def test_a_group_creating_logs_flushes_their_folder_once(tmp_path, monkeypatch):
    """Two new logs in one group below the syncfs threshold: their frames are fdatasync'd and
    their folder fsync'd once for both, with the group's flush, not once per log created."""
    from sdcp_fast.commitlog.directory import LogDirectory

    flushes, folders = _Flushes(monkeypatch), _FolderSyncs(monkeypatch)
    directory = LogDirectory(str(tmp_path))
    names = _new_names(2)
    assert directory.append_many([(name, commit(1, 1), '"0"') for name in names]) == ['"1"', '"1"']
    assert folders.folders == [str(tmp_path / "logs")] and len(flushes.fdatasync) == 2
    assert directory.append_many([(name, commit(1, 2), '"1"') for name in names]) == ['"2"', '"2"']
    assert folders.folders == [str(tmp_path / "logs")], "a log holding records has a durable name"
    directory.close()


def test_a_syncfs_group_needs_no_folder_fsync(tmp_path, monkeypatch):
    from sdcp_fast.commitlog.directory import LogDirectory

    flushes, folders = _Flushes(monkeypatch), _FolderSyncs(monkeypatch)
    directory = LogDirectory(str(tmp_path))
    names = _new_names(file_log.SYNCFS_FROM)
    assert directory.append_many([(name, commit(1, 1), '"0"') for name in names]) == ['"1"'] * len(names)
    assert (len(flushes.syncfs), flushes.fdatasync, folders.folders) == (1, [], [])
    directory.close()


def test_an_empty_log_someone_else_created_gets_its_folder_flushed(tmp_path, monkeypatch):
    """A log file that holds no record may have a name nobody made durable (its creator died
    or never appended): the first record flushed in it flushes the folder, whoever appends."""
    path = tmp_path / "logs" / "a.log"
    path.parent.mkdir()
    path.touch()
    folders = _FolderSyncs(monkeypatch)
    log = FileCommitLog(str(path))
    assert log.append(commit(1, 1), '"0"') == '"1"'
    assert folders.folders == [str(path.parent)]
    log.close()
    again = FileCommitLog(str(path))
    assert again.append(commit(1, 2), '"1"') == '"2"'
    assert folders.folders == [str(path.parent)]
    again.close()


def test_a_failed_folder_flush_fails_the_new_logs_entries(tmp_path, monkeypatch):
    a, b = _logs(tmp_path, 2)
    a.append(commit(1, 1), '"0"')
    folders = _FolderSyncs(monkeypatch, fail=True)
    results = _group([(a, commit(1, 2), '"1"'), (b, commit(1, 1), '"0"')])
    assert results[0] == '"2"' and type(results[1]) is OSError
    assert b.read().records == [] and os.path.getsize(b.path) == 0, "no frame of an unanswered entry stays"
    folders.fail = False
    assert b.append(commit(1, 1), '"0"') == '"1"', "the next flush makes the name durable"
    assert len(folders.folders) == 2


def test_a_failed_flush_never_cuts_another_writers_record_read_in_by_the_group(tmp_path, monkeypatch):
    """Another writer's record, appended since this handle last looked, is read in when the
    group takes the log (its tag counts it); a flush that fails then cuts back only the group's
    own frame, never that acknowledged record."""
    a, b = _logs(tmp_path, 2)
    other = FileCommitLog(a.path)
    assert other.append(commit(1, 1), '"0"') == '"1"'
    _Flushes(monkeypatch, fail={a._fd})
    results = _group([(a, commit(1, 2), '"1"'), (b, commit(1, 1), '"0"')])
    assert isinstance(results[0], OSError) and results[1] == '"1"'
    monkeypatch.undo()
    assert FileCommitLog(a.path).read().records == [commit(1, 1)]
    assert _group([(a, commit(1, 2), '"1"')]) == ['"2"']
    assert other.read().records == [commit(1, 1), commit(1, 2)]
    other.close()
