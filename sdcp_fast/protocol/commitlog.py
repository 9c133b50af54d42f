"""Commit-log records and the fencing rule (draft §6.8).

Storage lives elsewhere (sdcp_fast.cache / sdcp_fast.commitlog backends); this module
only says what a record is, how it is encoded, and whether an append is allowed.

TODO(protocol-codec): encode_record / decode_record with the core's deterministic CBOR.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class CommitRecord:
    epoch: int
    round: int
    emitted: tuple[int, ...]
    committed: int
    digest: bytes


@dataclass(frozen=True)
class FenceRecord:
    """Carries only an epoch: after it, appends with a lower epoch MUST fail."""

    epoch: int


LogRecord = CommitRecord | FenceRecord


def fence_epoch(records: Sequence[LogRecord]) -> int:
    """The highest epoch fenced so far (0 when there is no fence)."""
    return max((r.epoch for r in records if isinstance(r, FenceRecord)), default=0)


def append_allowed(records: Sequence[LogRecord], record: LogRecord) -> bool:
    """Whether ``record`` may follow ``records`` under §6.8's fencing rule."""
    return record.epoch >= fence_epoch(records)


def append_survived(records: Sequence[LogRecord], index: int) -> bool:
    """Read-after-append check for stores that cannot enforce fencing (§6.8).

    ``records`` is the log as read back after appending at ``index``; the append counts
    as failed if a fence with a higher epoch precedes it.
    """
    if index >= len(records):
        return False
    own = records[index]
    return all(
        not (isinstance(r, FenceRecord) and r.epoch > own.epoch) for r in records[:index]
    )


def encode_record(record: LogRecord) -> bytes:
    raise NotImplementedError


def decode_record(data: bytes) -> LogRecord:
    raise NotImplementedError
