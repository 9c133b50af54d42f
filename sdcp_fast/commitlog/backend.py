"""What a commit-log backend offers (§6.8) and the failures it reports.

The entity tag of a log is its record count, quoted (``"3"``). Every backend gives a
failed append the same meaning:

- ``Fenced`` (a ``StaleEpoch``, 409 ``sdcp-stale-epoch``): a fence with a higher epoch is in
  the log. It is checked first and wins whatever tag the writer gave (a stale one, a
  malformed one, or none): a fenced writer must stop, not re-read and retry.
- ``PreconditionFailed`` (412): another append happened since the tag the writer gave (or
  the tag is not one this log ever had). Nothing else raises it, and it is never replaced
  by a generic error: the writer's next step is to re-read the log.
- ``RecordTooLarge`` (413): the backend could not read the record back, so it refuses it
  before writing anything.

A backend that checks the fence in the same atomic step as the tag says so with
``enforces_fencing = True``. For one that does not (a plain object store with only a
conditional put), :func:`append_checked` reads the log back after the append and applies
§6.8's read-after-append rule (``append_survived``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Protocol

from sdcp_fast.protocol.commitlog import LogRecord, append_survived, fence_epoch
from sdcp_fast.protocol.problems import SdcpProblem, StaleEpoch


class PreconditionFailed(SdcpProblem):
    """Another append happened since the tag the writer gave (HTTP 412 on If-Match)."""

    suffix = "mlc-precondition-failed"
    status = 412
    title = "Commit log changed since it was read"


class Fenced(StaleEpoch):
    """A fence with a higher epoch is in the log: the writer must stop serving the session."""


class RecordTooLarge(SdcpProblem):
    """The record is larger than the backend can store and read back; nothing was written."""

    suffix = "mlc-record-too-large"
    status = 413
    title = "Commit record too large for this log"


class UnknownLog(SdcpProblem):
    """No record was ever appended to this log (a read creates nothing)."""

    suffix = "mlc-unknown-log"
    status = 404
    title = "No such commit log"


class LogCorrupt(SdcpProblem):
    """The stored log is damaged in a way a crash cannot explain: refuse to serve it."""

    suffix = "mlc-log-corrupt"
    status = 500
    title = "Commit log is corrupt"


class LogFull(SdcpProblem):
    """The log holds as many records or bytes as the backend keeps for one log; nothing was written."""

    suffix = "mlc-log-full"
    status = 507
    title = "Commit log is full"


@dataclass(frozen=True)
class LogView:
    records: list[LogRecord]  # from ``start`` on
    start: int
    etag: str  # of the whole log at the time of the read

    @property
    def length(self) -> int:
        return self.start + len(self.records)


class CommitLog(Protocol):
    ref: str
    # Whether ``append`` checks the fence atomically with the tag (else use append_checked).
    enforces_fencing: ClassVar[bool]

    def read(self, start: int = 0) -> LogView:
        ...

    def append(self, record: LogRecord, if_match: str | None) -> str:
        """Append ``record``; ``if_match`` None appends unconditionally (still fenced).
        Returns the new entity tag; raises Fenced, PreconditionFailed or RecordTooLarge."""
        ...

    def close(self) -> None:
        ...


def append_checked(log: CommitLog, record: LogRecord, etag: str | None) -> str:
    """``log.append`` plus §6.8's read-after-append check where the backend does not fence.

    The append is conditioned on ``etag``; on a backend without atomic fencing the log is
    read back and the append counts as failed (``Fenced``) if a fence with a higher epoch
    precedes the record. Returns the log's new tag.
    """
    new = log.append(record, etag)
    if log.enforces_fencing:
        return new
    index = length_of(new) - 1
    records = log.read(0).records
    if index >= len(records) or records[index] != record:
        raise PreconditionFailed(f"record {index} read back is not the one appended")
    if not append_survived(records, index):
        raise fence_error(fence_epoch(records[:index]), record)
    return new


def etag_of(length: int) -> str:
    return f'"{length}"'


def length_of(etag: str) -> int:
    text = etag.strip()
    if text.startswith("W/"):
        raise PreconditionFailed("weak entity tags do not match for appends")
    if len(text) < 3 or text[0] != '"' or text[-1] != '"' or not text[1:-1].isdigit() or len(text) > 24:
        raise PreconditionFailed(f"not an entity tag of this log: {etag!r}")
    return int(text[1:-1])


def fence_error(fence: int, record: LogRecord) -> Fenced:
    return Fenced(f"log is fenced at epoch {fence}; an append at epoch {record.epoch} must fail",
                  extra={"fence": fence})
