"""The §6.8 contract, run against every backend."""

from __future__ import annotations

import threading

import pytest

from sdcp_fast.commitlog import Fenced, PreconditionFailed, append_checked
from sdcp_fast.protocol.commitlog import CommitRecord, FenceRecord


def commit(epoch: int, round_: int) -> CommitRecord:
    return CommitRecord(epoch=epoch, round=round_, emitted=(round_, 7), committed=2 * round_,
                        digest=bytes([round_ % 256]) * 32)


def test_empty_log_reads_empty_with_tag(log_factory):
    view = log_factory().read()
    assert view.records == [] and view.etag == '"0"' and view.length == 0


def test_appends_read_back_in_order_and_from_offset(log_factory):
    log = log_factory()
    etag = log.read().etag
    for r in range(1, 4):
        etag = append_checked(log, commit(1, r), etag)
    assert etag == '"3"'
    assert log.read().records == [commit(1, 1), commit(1, 2), commit(1, 3)]
    tail = log.read(2)
    assert tail.records == [commit(1, 3)] and tail.start == 2 and tail.etag == '"3"'
    assert log.read(5).records == []


def test_stale_tag_fails_with_412(log_factory):
    a, b = log_factory(), log_factory()
    seen = a.read().etag
    b.append(commit(1, 1), b.read().etag)
    with pytest.raises(PreconditionFailed) as exc:
        a.append(commit(1, 1), seen)
    assert exc.value.status == 412
    assert a.read().records == [commit(1, 1)]


def test_fence_stops_lower_epoch_and_keeps_earlier_records(log_factory):
    verifier, router = log_factory(), log_factory()
    etag = verifier.append(commit(1, 1), verifier.read().etag)
    router.append(FenceRecord(2), None)
    fresh = verifier.read().etag
    with pytest.raises(Fenced) as exc:
        verifier.append(commit(1, 2), fresh)
    assert exc.value.status == 409 and exc.value.suffix == "sdcp-stale-epoch"
    assert etag == '"1"'
    assert verifier.read().records == [commit(1, 1), FenceRecord(2)], "epoch-1 record written before the fence stays"
    router.append(commit(2, 2), router.read().etag)
    with pytest.raises(Fenced):
        router.append(FenceRecord(1), None)
    assert router.read().records[-1] == commit(2, 2)


def test_fence_is_checked_before_the_tag(log_factory):
    log = log_factory()
    log.append(FenceRecord(3), None)
    with pytest.raises(Fenced):
        log.append(commit(2, 1), '"0"')


def test_concurrent_writers_exactly_one_wins_each_slot(log_factory):
    writers = [log_factory() for _ in range(4)]
    slots = 6
    wins: list[tuple[int, int]] = []
    lock = threading.Lock()

    def run(w: int) -> None:
        log = writers[w]
        while True:
            view = log.read()
            if view.length >= slots:
                return
            try:
                log.append(commit(1, 100 * w + view.length), view.etag)
            except PreconditionFailed:
                continue
            with lock:
                wins.append((view.length, w))

    threads = [threading.Thread(target=run, args=(w,)) for w in range(len(writers))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    records = writers[0].read().records
    assert len(records) >= slots
    won = sorted(wins)
    assert [slot for slot, _ in won] == list(range(len(records))), "one winner per slot"
    for slot, w in won:
        assert records[slot].round == 100 * w + slot



def test_a_bad_tag_is_a_failed_precondition_and_a_fence_wins_over_any_tag(log_factory):
    log = log_factory()
    log.append(commit(1, 1), '"0"')
    for tag in ('"0"', '"7"', "W/\"1\"", "nonsense", '"99999999999999999999999"'):
        with pytest.raises(PreconditionFailed):
            log.append(commit(1, 2), tag)
    log.append(FenceRecord(3), None)
    for tag in ('"0"', '"2"', "nonsense", None):
        with pytest.raises(Fenced):
            log.append(commit(2, 2), tag)
    assert log.read().records == [commit(1, 1), FenceRecord(3)]


def test_backends_declare_whether_they_enforce_fencing(log_factory):
    assert log_factory().enforces_fencing is True


class _UnfencedLog:
    """An object store with only a conditional put: it never looks at fences."""

    enforces_fencing = False
    ref = "stub://unfenced"

    def __init__(self) -> None:
        self.records: list = []

    def read(self, start: int = 0):
        from sdcp_fast.commitlog import LogView, etag_of

        return LogView(self.records[start:], start, etag_of(len(self.records)))

    def append(self, record, if_match):
        from sdcp_fast.commitlog import etag_of, length_of

        if if_match is not None and length_of(if_match) != len(self.records):
            raise PreconditionFailed(f"log has {len(self.records)} records")
        self.records.append(record)
        return etag_of(len(self.records))

    def close(self) -> None:
        pass


def test_append_checked_reads_back_on_a_backend_that_does_not_fence():
    from sdcp_fast.commitlog import append_checked

    log = _UnfencedLog()
    assert append_checked(log, commit(1, 1), '"0"') == '"1"'
    log.append(FenceRecord(2), None)
    assert log.append(commit(1, 2), '"2"') == '"3"', "the stub itself lets a fenced writer append"
    with pytest.raises(Fenced) as exc:
        append_checked(log, commit(1, 3), '"3"')
    assert exc.value.extra["fence"] == 2
    assert append_checked(log, commit(2, 3), '"4"') == '"5"', "the new epoch's writer passes"
