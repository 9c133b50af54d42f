"""Commit-log records (§6.8): encoding, decoding and the fencing rule."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sdcp_fast.protocol import cbor
from sdcp_fast.protocol.commitlog import (
    CommitRecord,
    FenceRecord,
    append_allowed,
    append_survived,
    classify_failed_append,
    decode_log,
    decode_record,
    encode_record,
    fence_epoch,
    writer_conflict,
)
from sdcp_fast.protocol.problems import BadRequest, SdcpProblem

U64 = st.integers(0, (1 << 64) - 1)
commits = st.builds(
    CommitRecord, epoch=U64, round=U64, emitted=st.lists(U64, max_size=6).map(tuple), committed=U64,
    digest=st.binary(min_size=32, max_size=32),
)
fences = st.builds(FenceRecord, epoch=U64)
records = st.one_of(commits, fences)
COMMIT = CommitRecord(epoch=2, round=5, emitted=(7, 8), committed=9, digest=b"\xab" * 32)


def test_fence_record_is_a_map_with_only_the_epoch() -> None:
    assert encode_record(FenceRecord(3)).hex() == "a16565706f636803"


def test_commit_record_encoding_is_deterministic_cbor_of_its_five_members() -> None:
    expected = cbor.deterministic_cbor(
        {"epoch": 2, "round": 5, "emitted": [7, 8], "committed": 9, "digest": b"\xab" * 32}
    )
    assert encode_record(COMMIT) == expected


@given(records)
def test_roundtrip(record: CommitRecord | FenceRecord) -> None:
    assert decode_record(encode_record(record)) == record


@given(st.lists(records, max_size=6))
def test_log_is_a_cbor_sequence_of_records(log: list[CommitRecord | FenceRecord]) -> None:
    assert decode_log(b"".join(encode_record(r) for r in log)) == log


def test_unknown_keys_are_ignored() -> None:
    raw = cbor.decode(encode_record(COMMIT))
    assert decode_record(cbor.deterministic_cbor({**raw, "writer": "v1"})) == COMMIT
    assert decode_record(cbor.deterministic_cbor({"epoch": 4, "by": "router"})) == FenceRecord(4)


@pytest.mark.parametrize("raw", [
    [], {"round": 1}, {"epoch": -1}, {"epoch": True}, {"epoch": 1, "round": 1},
    {"epoch": 1, "round": 1, "emitted": [], "committed": 0, "digest": b"\x00" * 31},
    {"epoch": 1, "round": 1, "emitted": 3, "committed": 0, "digest": b"\x00" * 32},
    {"epoch": 1, "round": 1, "emitted": [-1], "committed": 0, "digest": b"\x00" * 32},
])
def test_malformed_records_are_bad_request(raw: object) -> None:
    with pytest.raises(BadRequest):
        decode_record(cbor.deterministic_cbor(raw))


@pytest.mark.parametrize("record", [
    FenceRecord(-1), CommitRecord(1, 1, (1 << 64,), 0, b"\x00" * 32), CommitRecord(1, 1, (), 0, b"\x00"),
    "not a record",
])
def test_encoding_invalid_records_is_bad_request(record: object) -> None:
    with pytest.raises(BadRequest):
        encode_record(record)  # type: ignore[arg-type]


@given(st.binary(max_size=64))
def test_random_bytes_decode_only_to_problems(data: bytes) -> None:
    try:
        decode_record(data)
    except SdcpProblem:
        pass


def test_fence_epoch_and_append_rule() -> None:
    log = [CommitRecord(1, 1, (5,), 1, b"\x00" * 32), FenceRecord(2)]
    assert fence_epoch([]) == 0
    assert fence_epoch(log) == 2
    assert not append_allowed(log, CommitRecord(1, 2, (6,), 2, b"\x00" * 32))
    assert append_allowed(log, CommitRecord(2, 2, (6,), 2, b"\x00" * 32))
    assert not append_allowed(log, FenceRecord(1))


def test_append_survived_checks_fences_before_the_own_record() -> None:
    own = CommitRecord(1, 2, (6,), 2, b"\x00" * 32)
    assert append_survived([own], 0)
    assert not append_survived([FenceRecord(2), own], 1)
    assert append_survived([own, FenceRecord(2)], 0)  # fenced after: the append itself stood
    assert append_survived([FenceRecord(1), own], 1)
    assert not append_survived([own], 1)


def test_classify_failed_append():
    """A failed or unanswered conditional append (412), judged from the log read again."""
    own = CommitRecord(epoch=2, round=5, emitted=(7,), committed=9, digest=b"\x09" * 32)
    rival = CommitRecord(epoch=2, round=5, emitted=(8,), committed=9, digest=b"\x08" * 32)
    before = [CommitRecord(epoch=1, round=4, emitted=(3,), committed=8, digest=b"\x08" * 32),
              FenceRecord(2)]
    assert classify_failed_append([*before, own], own) == "committed"  # only the answer was lost
    assert classify_failed_append([*before, FenceRecord(3)], own) == "fenced"
    assert classify_failed_append([*before, FenceRecord(3), own], own) == "fenced"  # §6.8 order
    assert classify_failed_append([*before, own, FenceRecord(3)], own) == "committed"
    assert classify_failed_append([*before, rival], own) == "lost"
    assert classify_failed_append(before, own) == "lost"
    assert classify_failed_append([FenceRecord(2), own], own) == "committed"  # an equal fence is ours


def _commit(epoch: int, round_: int) -> CommitRecord:
    return CommitRecord(epoch=epoch, round=round_, emitted=(round_,), committed=round_, digest=bytes([round_]) * 32)


def test_a_writer_follows_the_last_record_of_its_epoch() -> None:
    """§6.8: the next record follows the last one this epoch's writer wrote; with none, the
    session starts where its open says; a higher epoch in the log ends it."""
    log = [_commit(1, 1), _commit(1, 2), FenceRecord(2)]

    def conflict(records, epoch: int, round_: int) -> str | None:
        return writer_conflict(records, epoch=epoch, round=round_, committed=round_, digest=bytes([round_]) * 32)

    assert conflict([], 1, 0) is None
    assert conflict(log[:2], 1, 2) is None  # the same writer, where it left off
    assert conflict(log, 2, 2) is None  # resumed at the last commit, nothing of epoch 2 yet
    assert conflict(log, 2, 1) is None  # the resume is the router's: no record of epoch 2 to follow
    # Epoch 2 wrote rounds 3 and 4, then restarted and was opened again at the resume of round 2.
    assert "round 4" in (conflict([*log, _commit(2, 3), _commit(2, 4)], 2, 2) or "")
    assert conflict([*log, _commit(2, 3), _commit(2, 4)], 2, 4) is None
    assert "round 2" in (conflict(log[:2], 1, 0) or "")  # epoch 1 restarted: opened again at round 0
    assert "fence of epoch 2" in (conflict(log, 1, 2) or "")
    assert "commit record of epoch 3" in (conflict([*log[:2], _commit(3, 3)], 2, 2) or "")
    # The digest and committed length are part of where a writer stands, not only the round.
    assert conflict(log[:2], 1, 2) is None
    assert writer_conflict(log[:2], epoch=1, round=2, committed=2, digest=b"\0" * 32) is not None
