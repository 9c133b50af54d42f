"""Commit-log records and the fencing rule (draft §6.8).

Storage lives elsewhere (sdcp_fast.cache / sdcp_fast.commitlog backends); this module
only says what a record is, how it is encoded, and whether an append is allowed.

A record is one deterministic CBOR map (docs/interpretations.md, "Commit-log records"):
a commit record ``{epoch, round, emitted, committed, digest}``, a fence record ``{epoch}``
alone. A log read back whole is a CBOR sequence (RFC 8742) of records.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from sdcp_fast.protocol import cbor
from sdcp_fast.protocol.problems import BadRequest


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


def writer_conflict(records: Sequence[LogRecord], *, epoch: int, round: int, committed: int,
                    digest: bytes) -> str | None:
    """Why a verifier whose session is at ``epoch``, last round ``round``, ``committed``
    output tokens and digest ``digest`` may not append its next commit record to a log holding
    ``records``; None when it may.

    §6.8: a commit record carries the session's current epoch and follows the last record its
    writer wrote. Records of ``epoch`` already in the log were written by this epoch's verifier
    before it lost its state (a restart, re-opened with the session-open it held): the session
    must then be where the last of them left it, or its next round would repeat rounds the log
    holds. A fence or a commit of a higher epoch means the epoch is over. With no record of
    ``epoch`` the writer starts where its open says (the resume the router read after its
    fence).
    """
    last: CommitRecord | None = None
    for record in records:
        if record.epoch > epoch:
            kind = "fence" if isinstance(record, FenceRecord) else "commit record"
            return f"the log holds a {kind} of epoch {record.epoch}, above this session's epoch {epoch}"
        if isinstance(record, CommitRecord) and record.epoch == epoch:
            last = record
    if last is not None and (last.round, last.committed, last.digest) != (round, committed, digest):
        return (f"the log holds round {last.round} ({last.committed} tokens) of epoch {epoch}, and the session "
                f"is at round {round} ({committed} tokens): this epoch was served before this open")
    return None


AppendOutcome = Literal["committed", "fenced", "lost"]


def classify_failed_append(records: Sequence[LogRecord], own: CommitRecord) -> AppendOutcome:
    """What a conditional append that failed (412) or went unanswered did, from the log as
    re-read afterwards (§6.3 Commit, §6.8; docs/interpretations.md):

    - ``"committed"``: ``own`` is in the log with no higher fence before it: the append
      happened and only its answer was lost. The round is committed: release it.
    - ``"fenced"``: a fence with an epoch above ``own.epoch`` is in the log (before ``own``,
      when ``own`` is there at all): a newer epoch owns the session. Discard the round,
      release nothing, stop serving the session.
    - ``"lost"``: neither: another writer of this epoch appended. The log no longer follows
      this verifier's state, so the round is discarded and the session stopped as if fenced;
      the router's fail-over (§6.9) resumes it from the log.

    Only ``"committed"`` releases anything: ``append_done(ok=True)``; the other two are
    ``append_done(ok=False, fenced=True)``.
    """
    for record in records:
        if isinstance(record, FenceRecord) and record.epoch > own.epoch:
            return "fenced"
        if record == own:
            return "committed"
    return "lost"


_COMMIT_KEYS = ("epoch", "round", "emitted", "committed", "digest")


def encode_record(record: LogRecord) -> bytes:
    """The record as deterministic CBOR; :class:`BadRequest` if a member is out of its type."""
    if isinstance(record, FenceRecord):
        return cbor.deterministic_cbor({"epoch": _uint(record.epoch, "epoch")})
    if not isinstance(record, CommitRecord):
        raise BadRequest(f"{type(record).__name__} is not a commit-log record")
    return cbor.deterministic_cbor({
        "epoch": _uint(record.epoch, "epoch"),
        "round": _uint(record.round, "round"),
        "emitted": _uints(record.emitted),
        "committed": _uint(record.committed, "committed"),
        "digest": _digest(record.digest),
    })


def decode_record(data: bytes) -> LogRecord:
    """One record; a map holding ``epoch`` and none of the commit members is a fence.

    Keys the record format does not define are ignored, as in messages (§5.2).
    """
    return _from_map(cbor.decode(data))


def record_from_map(raw: Any) -> LogRecord:
    """One record from its decoded CBOR item, checked as :func:`decode_record` checks it."""
    return _from_map(raw)


def decode_log(data: bytes) -> list[LogRecord]:
    """Every record of a log stored as one CBOR sequence, in order."""
    return [_from_map(item) for item in cbor.decode_sequence(data)]


def _from_map(raw: Any) -> LogRecord:
    if not isinstance(raw, dict):
        raise BadRequest("commit-log record must be a CBOR map")
    if "epoch" not in raw:
        raise BadRequest("commit-log record lacks its epoch")
    epoch = _uint(raw["epoch"], "epoch")
    present = [k for k in _COMMIT_KEYS[1:] if k in raw]
    if not present:
        return FenceRecord(epoch)
    if len(present) != len(_COMMIT_KEYS) - 1:
        missing = sorted(set(_COMMIT_KEYS[1:]) - set(present))
        raise BadRequest(f"commit record lacks {missing}")
    emitted = raw["emitted"]
    if not isinstance(emitted, list):
        raise BadRequest("commit record emitted must be an array")
    return CommitRecord(
        epoch=epoch,
        round=_uint(raw["round"], "round"),
        emitted=_uints(emitted),
        committed=_uint(raw["committed"], "committed"),
        digest=_digest(raw["digest"]),
    )


def _uint(value: Any, name: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= cbor.UINT64_MAX:
        raise BadRequest(f"commit-log {name} must be an unsigned 64-bit integer")
    return int(value)


def _uints(values: Any) -> tuple[int, ...]:
    # A record may hold millions of tokens: the whole list is checked in one call when it can be.
    if cbor.all_uints(values):
        return tuple(values)
    return tuple(_uint(t, "emitted token") for t in values)


def _digest(value: Any) -> bytes:
    if not isinstance(value, bytes) or len(value) != 32:
        raise BadRequest("commit-log digest must be 32 bytes")
    return value
