"""Commit-log records as the MLC server takes them from untrusted peers: only the members the
record format defines are decoded (sdcp_fast.protocol.cbor.decode_members); the rest of the
record is checked but never built, so a valid record with a huge ignored member costs no Python
objects and holds no other client up, and the members that are built are bounded."""

from __future__ import annotations

from typing import Any

from sdcp_fast.protocol import cbor
from sdcp_fast.protocol.commitlog import CommitRecord, LogRecord, record_from_map

RECORD_KEYS = ("epoch", "round", "emitted", "committed", "digest")  # protocol/commitlog.py's members
# Data items a record's members may hold: its tokens and a few scalars. A record is at most
# MAX_RECORD (16 MiB) bytes, so this is also about as many tokens as one can carry.
MAX_ITEMS = 1 << 24


def decode_stored_record(data: bytes, *, max_items: int = MAX_ITEMS) -> LogRecord:
    """One record from ``data`` (BadRequest for anything else), as ``decode_record`` reads it."""
    return decode_to_store(data, max_items=max_items)[0]


def decode_to_store(data: bytes, *, max_items: int = MAX_ITEMS) -> tuple[LogRecord, bytes]:
    """:func:`decode_stored_record`'s record and the bytes the log stores for it, which are
    ``encode_record``'s of that record: the members it was read from, once they pass the
    format's checks, encoded deterministically (no record encoded again member by member)."""
    members = cbor.decode_members(data, RECORD_KEYS, max_items)
    # Only the known members are left: the format's own checks read them, as decode_record's.
    plain = None if members is None else _plain_commit(members)
    record = plain if plain is not None else record_from_map(members if members is not None else [])
    assert members is not None  # record_from_map refuses anything but a map
    return record, cbor.deterministic_cbor(members)


_new = object.__new__
_UINT = cbor.UINT64_MAX


def _plain_commit(members: dict[str, Any]) -> CommitRecord | None:
    """The commit record of ``members`` when every member plainly passes the format's checks,
    built in one step (a frozen dataclass's constructor sets each field on its own); None for
    anything else, which ``record_from_map`` reads with its own checks and problems. A group
    commit reads a record per session per pass: this is most of their decoding."""
    if len(members) != len(RECORD_KEYS):  # a fence, or a commit record lacking a member
        return None
    epoch, round_, committed = members["epoch"], members["round"], members["committed"]
    emitted, digest = members["emitted"], members["digest"]
    if not (type(epoch) is int and type(round_) is int and type(committed) is int  # not bool either
            and 0 <= epoch <= _UINT and 0 <= round_ <= _UINT and 0 <= committed <= _UINT
            and type(digest) is bytes and len(digest) == 32 and type(emitted) is list and cbor.all_uints(emitted)):
        return None
    record: CommitRecord = _new(CommitRecord)
    record.__dict__.update(epoch=epoch, round=round_, emitted=tuple(emitted), committed=committed, digest=digest)
    return record
