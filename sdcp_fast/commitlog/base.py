"""What a commit-log backend offers (§6.8) and the failures it reports.

The entity tag of a log is its record count, quoted (``"3"``): an append conditioned on
the tag a writer last read succeeds only if nobody appended since. Fencing is enforced by
the backend in the same atomic step as the tag check.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from sdcp_fast.protocol.commitlog import LogRecord
from sdcp_fast.protocol.problems import SdcpProblem, StaleEpoch


class PreconditionFailed(SdcpProblem):
    """Another append happened since the writer last read (HTTP 412 on If-Match)."""

    suffix = "mlc-precondition-failed"
    status = 412
    title = "Commit log changed since it was read"


class Fenced(StaleEpoch):
    """A fence with a higher epoch is in the log: the writer must stop serving the session."""


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

    def read(self, start: int = 0) -> LogView:
        ...

    def append(self, record: LogRecord, if_match: str | None) -> str:
        """Append ``record``; ``if_match`` None appends unconditionally (still fenced).
        Returns the new entity tag; raises PreconditionFailed or Fenced."""
        ...

    def close(self) -> None:
        ...


def etag_of(length: int) -> str:
    return f'"{length}"'


def length_of(etag: str) -> int:
    text = etag.strip()
    if text.startswith("W/"):
        raise PreconditionFailed("weak entity tags do not match for appends")
    if len(text) < 3 or text[0] != '"' or text[-1] != '"' or not text[1:-1].isdigit():
        raise PreconditionFailed(f"not an entity tag of this log: {etag!r}")
    return int(text[1:-1])


def fence_error(fence: int, record: LogRecord) -> Fenced:
    return Fenced(f"log is fenced at epoch {fence}; an append at epoch {record.epoch} must fail",
                  extra={"fence": fence})
