"""The directory of an MLC's commit logs: a log being opened (its whole file read) holds up
only its own users, never another log's appends; concurrent openers of one log share one
open file."""

from __future__ import annotations

import threading

import pytest

from sdcp_fast.commitlog import directory
from sdcp_fast.commitlog.directory import LogDirectory
from sdcp_fast.commitlog.file import FileCommitLog
from sdcp_fast.protocol.commitlog import CommitRecord

SLOW = "mlc://" + "0" * 32 + "/AAAAAAAAAAAAAAAAAAAAAA/commit_log"
OTHER = "mlc://" + "0" * 32 + "/BBBBBBBBBBBBBBBBBBBBBA/commit_log"


def record(n: int) -> CommitRecord:
    return CommitRecord(1, n, (n,), n, bytes(32))


def test_opening_a_large_log_does_not_hold_up_other_logs(tmp_path, monkeypatch):
    logs = LogDirectory(str(tmp_path), sync=False)
    logs.log(SLOW).append(record(0), None)
    logs.close()  # the next use opens (parses) the file again
    parsing, finish = threading.Event(), threading.Event()

    class SlowToOpen(FileCommitLog):
        def __init__(self, path: str, **kwargs: object) -> None:
            if path.endswith(directory.log_path("", SLOW).rsplit("/", 1)[1]):
                parsing.set()
                finish.wait(10)  # what reading a 31 MiB log takes
            super().__init__(path, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(directory, "FileCommitLog", SlowToOpen)
    reader = threading.Thread(target=lambda: logs.log(SLOW).read())
    reader.start()
    try:
        assert parsing.wait(5)
        done = threading.Event()
        other = threading.Thread(target=lambda: (logs.log(OTHER).append(record(0), None), done.set()))
        other.start()
        assert done.wait(3), "an append to another log waited for a log being opened"
        other.join(5)
    finally:
        finish.set()
        reader.join(10)
    assert logs.log(SLOW).read().records == [record(0)]
    logs.close()


@pytest.mark.parametrize("create", [False, True])
def test_concurrent_openers_of_one_log_share_one_open_file(tmp_path, monkeypatch, create):
    logs = LogDirectory(str(tmp_path), sync=False)
    if not create:
        logs.log(SLOW).append(record(0), None)
        logs.close()
    opened: list[int] = []

    class Counted(FileCommitLog):
        def __init__(self, path: str, **kwargs: object) -> None:
            super().__init__(path, **kwargs)  # type: ignore[arg-type]
            opened.append(1)

    monkeypatch.setattr(directory, "FileCommitLog", Counted)
    start = threading.Barrier(8)

    def use(i: int) -> None:
        start.wait(5)
        if i % 2:
            logs.log(SLOW).read()
        else:
            logs.log(SLOW).append(record(100 + i), None)

    threads = [threading.Thread(target=use, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(logs.log(SLOW).read().records) == (4 if create else 5)
    assert sum(opened) == 1, "one open file for all users"
    assert logs.open_count == 1
    logs.close()


def test_an_append_walks_only_the_logs_it_closes(tmp_path):
    """Each append trims the table of open logs: under the bound that walks none of them, and
    over it only the least recently used idle ones it closes, never the whole table."""
    logs = LogDirectory(str(tmp_path), sync=False, max_open=300)
    names = ["mlc://" + "0" * 32 + f"/{n:022d}/commit_log" for n in range(301)]
    for name in names[:300]:
        logs.log(name).append(record(0), None)

    class Walked(type(logs._open)):  # type: ignore[misc]
        visits = 0

        def __iter__(self):
            for name in super().__iter__():
                Walked.visits += 1
                yield name

    logs._open = Walked(logs._open)
    etag = logs.log(names[0]).append(record(1), None)  # 300 open: under the bound
    assert Walked.visits == 0
    logs.log(names[300]).append(record(0), None)  # the 301st: one idle log closed
    assert Walked.visits <= 2 and logs.open_count == 300
    assert names[1] not in logs._open and names[0] in logs._open  # the least recently used one went
    assert logs.log(names[0]).read().etag == etag
    logs.close()
