"""The §6.8 contract, run against every backend."""

from __future__ import annotations

import threading

import pytest

from sdcp_fast.commitlog import Fenced, PreconditionFailed, append_commit
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
        etag = append_commit(log, commit(1, r), etag)
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


def test_append_commit_releases_leases_after_success_and_after_fencing(log_factory, tmp_path):
    import sdcp_fast.cache as cache

    with cache.embedded(str(tmp_path / "mlc"), host_bytes=1 << 16, disk_bytes=1 << 16) as mlc:
        q = cache.object_uri(bytes(16), bytes(16), "q_rows", 1)
        mlc.put(q, b"rows")
        log = log_factory()
        held = [mlc.lease(q, 30)]
        etag = append_commit(log, commit(1, 1), log.read().etag, mlc=mlc, leases=held)
        assert etag == '"1"' and not mlc.head(q).leased
        log.append(FenceRecord(2), None)
        held = [mlc.lease(q, 30)]
        with pytest.raises(Fenced):
            append_commit(log, commit(1, 2), log.read().etag, mlc=mlc, leases=held)
        assert not mlc.head(q).leased, "a discarded round still lets go of its objects"
