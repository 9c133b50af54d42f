"""The store's own bounds: index memory, object count, leases."""

from __future__ import annotations

import re

import pytest

from sdcp_fast.cache import MLC, CacheFull, ObjectLeased, ObjectUnavailable, UnknownLease, object_uri
from sdcp_fast.cache.index import MAX_LEASE_TTL, MAX_META_BYTES, OBJECT_OVERHEAD
from sdcp_fast.cache.tiers.disk import DiskTier
from sdcp_fast.cache.tiers.host import HostTier

SCOPE = bytes(range(16))


def uri(n: int) -> str:
    return object_uri(SCOPE, b"s" * 16, "q_rows", n)


@pytest.fixture
def mlc(tmp_path, clock):
    m = MLC([HostTier(1 << 20), DiskTier(1 << 20, str(tmp_path))], clock=clock, max_objects=8,
            index_bytes=16 * OBJECT_OVERHEAD + 4 * MAX_META_BYTES, max_leases=4)
    yield m
    m.close()


def test_meta_is_counted_and_capped(mlc):
    before = mlc.stats()["index"]["bytes"]
    mlc.put(uri(1), b"", meta={"note": "x" * 30000})
    assert mlc.stats()["index"]["bytes"] - before >= OBJECT_OVERHEAD + 30000
    with pytest.raises(ValueError):
        mlc.put(uri(2), b"", meta={"note": "x" * (MAX_META_BYTES + 1)})
    with pytest.raises(ValueError):
        mlc.put(uri(2), b"", meta=[1, 2])  # type: ignore[arg-type]
    mlc.delete(uri(1))
    assert mlc.stats()["index"]["bytes"] == before


def test_object_count_is_capped_by_evicting_the_least_recently_used(mlc):
    for n in range(20):
        mlc.put(uri(n), b"")
    stats = mlc.stats()
    assert stats["index"]["objects"] == 8 and sum(t["objects"] for t in stats["tiers"]) == 8
    assert [mlc.contains(uri(n)) for n in range(20)] == [False] * 12 + [True] * 8


def test_index_bytes_cap_evicts_objects_with_large_meta(mlc):
    for n in range(8):
        mlc.put(uri(n), b"", meta={"m": "x" * (MAX_META_BYTES - 100)})
    assert mlc.stats()["index"]["bytes"] <= mlc.index_bytes
    assert sum(mlc.contains(uri(n)) for n in range(8)) <= 5


def test_leased_objects_are_never_evicted_for_index_room(mlc):
    for n in range(4):
        mlc.put(uri(n), b"", lease_ttl=10)
    for n in range(4, 8):
        mlc.put(uri(n), b"")
    mlc.put(uri(8), b"")
    assert all(mlc.contains(uri(n)) for n in range(4)), "leased objects stay"
    with pytest.raises(CacheFull):  # the lease table is full (max_leases=4)
        mlc.lease(uri(5), 10)


def test_full_index_of_leased_objects_refuses(tmp_path, clock):
    with MLC([HostTier(1 << 16)], clock=clock, max_objects=2) as m:
        m.put(uri(1), b"a", lease_ttl=5)
        m.put(uri(2), b"b", lease_ttl=5)
        with pytest.raises(CacheFull):
            m.put(uri(3), b"c")
        with pytest.raises(ObjectLeased):
            m.put(uri(1), b"again")


def test_one_object_holds_a_bounded_number_of_leases(tmp_path, clock):
    from sdcp_fast.cache.index import MAX_LEASES_PER_OBJECT

    with MLC([HostTier(1 << 16)], clock=clock) as m:
        m.put(uri(1), b"x")
        held = [m.lease(uri(1), 5) for _ in range(MAX_LEASES_PER_OBJECT)]
        with pytest.raises(CacheFull):
            m.lease(uri(1), 5)
        m.release(held[0])
        m.lease(uri(1), 5)


def test_lease_ids_are_128_random_bits(mlc):
    mlc.put(uri(1), b"x")
    ids = [mlc.lease(uri(1), 1) for _ in range(3)]
    assert all(re.fullmatch(r"[0-9a-f]{32}", i) for i in ids)
    assert len(set(ids)) == 3 and len({i[:8] for i in ids}) == 3, "not an instance prefix plus a counter"


@pytest.mark.parametrize("ttl", [0, -1, MAX_LEASE_TTL + 1, 2.0 ** 64 / 1000, float("inf"), float("nan"), True])
def test_lease_ttls_are_bounded(mlc, ttl):
    mlc.put(uri(1), b"x")
    with pytest.raises(ValueError):
        mlc.lease(uri(1), ttl)
    with pytest.raises(ValueError):
        mlc.put(uri(2), b"x", lease_ttl=ttl)
    lease = mlc.lease(uri(1), MAX_LEASE_TTL)
    with pytest.raises(ValueError):
        mlc.renew(lease, ttl)


def test_renewals_do_not_grow_the_expiry_heap(mlc, clock):
    mlc.put(uri(1), b"x")
    lease = mlc.lease(uri(1), 5)
    for _ in range(20000):
        mlc.renew(lease, 5)
    assert len(mlc._expiry) <= 2 * len(mlc._leases) + 64
    clock.advance(4)
    assert mlc.head(uri(1)).leased, "the latest renewal still holds"
    clock.advance(2)
    assert not mlc.head(uri(1)).leased


def test_released_and_deleted_leases_leave_the_expiry_heap(mlc, clock):
    mlc.put(uri(1), b"x")
    for _ in range(10000):  # hour-long leases, each released at once
        mlc.release(mlc.lease(uri(1), MAX_LEASE_TTL))
    assert len(mlc._expiry) <= 2 * len(mlc._leases) + 64
    for _ in range(2000):  # objects deleted (or replaced) with their leases
        mlc.put(uri(2), b"y", MAX_LEASE_TTL)
        mlc._remove(mlc._index[uri(2)])
    assert len(mlc._expiry) <= 2 * len(mlc._leases) + 64
    lease = mlc.lease(uri(1), 5)
    clock.advance(6)
    assert not mlc.head(uri(1)).leased
    with pytest.raises(UnknownLease):
        mlc.release(lease)


def _scoped(scope: int, n: int = 1) -> str:
    return object_uri(scope.to_bytes(16, "big"), b"s" * 16, "q_rows", n)


def test_accounting_of_scopes_that_come_and_go_is_bounded_and_loses_no_count(tmp_path, clock):
    import tracemalloc

    with MLC([HostTier(1 << 20)], clock=clock, max_scopes=64) as m:
        m.put(_scoped(0), b"kept")

        def come_and_go(scopes: range) -> None:  # put, read, delete in a fresh scope; miss in another
            for s in scopes:
                m.put(_scoped(s), b"x" * 10)
                m.get(_scoped(s))
                m.delete(_scoped(s))
                with pytest.raises(ObjectUnavailable):
                    m.get(_scoped(s + 100000))

        tracemalloc.start()
        try:
            come_and_go(range(1, 3001))  # fills the name parsers' bounded caches too
            before, _ = tracemalloc.get_traced_memory()
            come_and_go(range(3001, 8001))
            grown = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
        scopes = m.stats()["scopes"]
        assert len(scopes) <= 65, f"{len(scopes)} scopes tracked"
        assert grown < 200 << 10, f"{grown} bytes traced for 5,000 more scopes gone"
        rows = [c for tiers in scopes.values() for c in tiers.values()]
        assert sum(c["hits"] for c in rows) == 8000 and sum(c["misses"] for c in rows) == 8000
        assert scopes[(0).to_bytes(16, "big").hex()]["host"]["objects"] == 1, "a scope holding objects keeps its row"


def test_scopes_beyond_the_table_share_one_row_while_they_hold_objects(tmp_path, clock):
    with MLC([HostTier(1 << 20)], clock=clock, max_scopes=8) as m:
        for s in range(20):
            m.put(_scoped(s), b"x" * 100)
        scopes = m.stats()["scopes"]
        assert len(scopes) == 9 and scopes["*"]["host"] == {"bytes": 1200, "objects": 12, "hits": 0, "misses": 0,
                                                            "evictions": 0}
        for s in range(20):
            m.delete(_scoped(s))
        assert all(c["bytes"] == 0 and c["objects"] == 0 for t in m.stats()["scopes"].values() for c in t.values())
        m.put(_scoped(99), b"y")
        assert m.stats()["scopes"][(99).to_bytes(16, "big").hex()]["host"]["objects"] == 1, "an idle row made way"


def test_many_small_objects_cost_bounded_memory(tmp_path, clock):
    import tracemalloc

    with MLC([HostTier(1 << 20)], clock=clock, max_objects=500) as m:
        tracemalloc.start()
        try:
            for n in range(5000):
                m.put(uri(n), b"")
            current, _ = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert m.stats()["index"]["objects"] == 500
        assert current < 500 * 8 * 1024, f"{current} bytes traced for 500 live objects"
