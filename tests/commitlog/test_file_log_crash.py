"""Crash safety of the embedded file log: kill -9 mid-stream loses nothing acknowledged."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from sdcp_fast.commitlog.file import FileCommitLog, frame
from sdcp_fast.protocol.commitlog import CommitRecord, FenceRecord

WRITER = r"""
import sys
from sdcp_fast.commitlog.file import FileCommitLog
from sdcp_fast.protocol.commitlog import CommitRecord
log = FileCommitLog(sys.argv[1])
view = log.read()
etag, n = view.etag, view.length
while True:
    etag = log.append(CommitRecord(1, n, (n,), n, n.to_bytes(32, "big")), etag)
    print(n, flush=True)  # acknowledged: fsync has returned
    n += 1
"""


def record(n: int) -> CommitRecord:
    return CommitRecord(1, n, (n,), n, n.to_bytes(32, "big"))


def test_kill_9_during_appends_loses_no_acknowledged_record(tmp_path):
    path = str(tmp_path / "crash.log")
    acked = -1
    deadline = time.monotonic() + 8
    kills = 0
    while kills < 6 and time.monotonic() < deadline:
        proc = subprocess.Popen([sys.executable, "-c", WRITER, path], stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        first = proc.stdout.readline()  # the writer is appending now
        assert first, "writer died before its first append"
        acked = max(acked, int(first))
        time.sleep(0.05 + 0.03 * kills)
        os.kill(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate(timeout=10)
        for line in out.splitlines():
            acked = max(acked, int(line))
        kills += 1
        with FileCommitLog(path) as log:
            records = log.read().records
        assert len(records) > acked, f"acknowledged record {acked} missing after kill -9 (have {len(records)})"
        assert records == [record(n) for n in range(len(records))], "records are whole and in order"
    assert kills >= 3


def test_torn_tail_is_ignored_on_reopen_and_cut_by_next_append(tmp_path):
    path = str(tmp_path / "torn.log")
    with FileCommitLog(path) as log:
        log.append(record(0), '"0"')
    whole = os.path.getsize(path)
    with open(path, "ab") as f:
        f.write(frame(record(1))[:-5])  # a writer died mid-record
    with FileCommitLog(path) as log:
        view = log.read()
        assert view.records == [record(0)] and view.etag == '"1"'
        log.append(FenceRecord(2), view.etag)
        assert log.read().records == [record(0), FenceRecord(2)]
    assert os.path.getsize(path) == whole + len(frame(FenceRecord(2)))
    with FileCommitLog(path) as log:
        assert log.read().records == [record(0), FenceRecord(2)]


def test_corrupt_checksum_tail_is_ignored(tmp_path):
    path = str(tmp_path / "crc.log")
    with FileCommitLog(path) as log:
        log.append(record(0), None)
    bad = bytearray(frame(record(1)))
    bad[-1] ^= 0xFF
    with open(path, "ab") as f:
        f.write(bad)
    with FileCommitLog(path) as log:
        assert log.read().records == [record(0)]


def test_writers_in_two_processes_share_one_file(tmp_path):
    path = str(tmp_path / "shared.log")
    script = (
        "import sys\nfrom sdcp_fast.commitlog.file import FileCommitLog\n"
        "from sdcp_fast.commitlog import PreconditionFailed\n"
        "from sdcp_fast.protocol.commitlog import CommitRecord\n"
        "log = FileCommitLog(sys.argv[1]); w = int(sys.argv[2]); won = 0\n"
        "while won < 20:\n"
        "    v = log.read()\n"
        "    try:\n"
        "        log.append(CommitRecord(1, w, (v.length,), v.length, bytes(32)), v.etag); won += 1\n"
        "    except PreconditionFailed:\n"
        "        pass\n"
    )
    procs = [subprocess.Popen([sys.executable, "-c", script, path, str(w)]) for w in range(2)]
    for p in procs:
        assert p.wait(timeout=60) == 0
    with FileCommitLog(path) as log:
        records = log.read().records
    assert len(records) == 40
    assert [r.emitted[0] for r in records] == list(range(40)), "each slot taken by exactly one writer"
    assert sorted(r.round for r in records) == [0] * 20 + [1] * 20
