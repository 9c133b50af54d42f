"""Torn tails of the file commit log whose records carry bytes that imitate frames.

A commit record's digest holds a whole, checksum-valid frame (a fence, a commit) and its
token array holds integers whose encodings look like frame headers. Each log is cut at
every byte inside its last frame (an append that never returned), and its last frame's bytes
are also damaged in place: every time, the log must read back exactly its complete records,
take the next append, and read back the same after a restart. Damage before the last frame
is still refused (``LogCorrupt``), never skipped.
"""

from __future__ import annotations

import os
import random

import pytest

from sdcp_fast.commitlog import LogCorrupt
from sdcp_fast.commitlog.file import _HEADER, FileCommitLog, frame
from sdcp_fast.protocol.commitlog import CommitRecord, FenceRecord, LogRecord

SEEDS = range(6)


def _imitating(rng: random.Random, n: int) -> LogRecord:
    """A record whose payload bytes contain frames, or look like their headers."""
    if rng.random() < 0.2:
        return FenceRecord(rng.randrange(1, 3))
    inner = frame(rng.choice([FenceRecord(rng.randrange(2, 1 << 20)), FenceRecord(9)]))
    digest = bytes(rng.randrange(256) for _ in range(32))
    at = rng.randrange(0, 32 - len(inner) + 1)
    digest = digest[:at] + inner + digest[at + len(inner):]
    # 8-byte integers whose big-endian bytes read as a header of a small frame.
    tokens = [int.from_bytes(_HEADER.pack(rng.randrange(1, 64), rng.randrange(1 << 32)), "big")
              for _ in range(rng.randrange(1, 6))]
    tokens += [rng.randrange(1 << 16) for _ in range(rng.randrange(0, 40))]
    return CommitRecord(2, n, tuple(rng.sample(tokens, len(tokens))), n, digest)


def _log(tmp_path, seed: int) -> tuple[str, list[LogRecord], bytes]:
    rng = random.Random(seed)
    records = [_imitating(rng, n) for n in range(rng.randrange(2, 6))]
    path = str(tmp_path / f"torn{seed}.log")
    with FileCommitLog(path, sync=False) as log:
        for r in records:
            log.append(r, None)
    return path, records, open(path, "rb").read()


def _recovers(path: str, whole: list[LogRecord]) -> None:
    with FileCommitLog(path, sync=False) as log:
        view = log.read()
        assert view.records == whole, "exactly the complete records read back"
        log.append(FenceRecord(3), view.etag)
    with FileCommitLog(path, sync=False) as log:
        assert log.read().records == [*whole, FenceRecord(3)]


@pytest.mark.parametrize("seed", SEEDS)
def test_cut_anywhere_inside_the_last_frame_is_a_torn_tail(tmp_path, seed):
    path, records, data = _log(tmp_path, seed)
    last = len(frame(records[-1]))
    for cut in range(len(data) - last + 1, len(data)):
        with open(path, "wb") as f:
            f.write(data[:cut])
        _recovers(path, records[:-1])


def test_torn_inside_the_emitted_array_after_a_digest_holding_a_fence_frame(tmp_path):
    digest = frame(FenceRecord(7)) + bytes(range(16))
    torn = CommitRecord(1, 1, tuple(range(100, 140)), 1, digest)
    path = str(tmp_path / "digest.log")
    with FileCommitLog(path, sync=False) as log:
        log.append(CommitRecord(1, 0, (1,), 0, bytes(32)), None)
    blob = frame(torn)
    at = blob.index(digest) + len(digest) + 10  # inside the emitted array
    with open(path, "ab") as f:
        f.write(blob[:at])
    _recovers(path, [CommitRecord(1, 0, (1,), 0, bytes(32))])


@pytest.mark.parametrize("seed", SEEDS)
def test_damaged_last_frame_or_unwritten_zeros_are_a_torn_tail(tmp_path, seed):
    path, records, data = _log(tmp_path, seed)
    rng = random.Random(seed)
    last = len(frame(records[-1]))
    for _ in range(20):
        damaged = bytearray(data)
        damaged[rng.randrange(len(data) - last + _HEADER.size, len(data))] ^= 1 + rng.randrange(255)
        with open(path, "wb") as f:
            f.write(bytes(damaged))
        _recovers(path, records[:-1])
    with open(path, "wb") as f:
        f.write(data[:len(data) - last] + bytes(last))  # extended, never written
    _recovers(path, records[:-1])


@pytest.mark.parametrize("seed", SEEDS)
def test_damage_before_the_last_frame_is_refused(tmp_path, seed):
    path, records, data = _log(tmp_path, seed)
    rng = random.Random(seed)
    first = len(frame(records[0]))
    damaged = bytearray(data)
    damaged[rng.randrange(_HEADER.size, first)] ^= 0x40  # inside the first record's body
    with open(path, "wb") as f:
        f.write(bytes(damaged))
    with pytest.raises(LogCorrupt):
        FileCommitLog(path, sync=False)
    assert os.path.getsize(path) == len(data), "nothing was cut"
