from __future__ import annotations

import pytest

from sdcp_fast.cache import BadRange, CacheFull, ObjectLeased, ObjectUnavailable, UnknownLease, object_uri
from sdcp_fast.cache.index import MLC
from sdcp_fast.cache.tiers.disk import DiskTier
from sdcp_fast.cache.tiers.host import HostTier

SCOPE = bytes(range(16))
OTHER = bytes(16)


def uri(n: int, scope: bytes = SCOPE) -> str:
    return object_uri(scope, b"s" * 16, "q_rows", n)


def blob(n: int, size: int = 1024) -> bytes:
    return bytes([n % 256]) * size


def tier_of(mlc, u: str) -> str:
    return mlc.head(u).tier


def test_put_get_roundtrip_is_a_view_of_stored_bytes(small_mlc):
    small_mlc.put(uri(1), bytearray(b"hello world"))
    view = small_mlc.get(uri(1))
    assert isinstance(view, memoryview) and view.readonly
    assert bytes(view) == b"hello world"


def test_put_copies_so_later_caller_writes_do_not_leak_in(small_mlc):
    src = bytearray(b"abc")
    small_mlc.put(uri(1), src)
    src[0] = ord("z")
    assert bytes(small_mlc.get(uri(1))) == b"abc"


def test_byte_ranges_on_every_tier(small_mlc):
    data = bytes(range(256)) * 8  # 2 KiB
    small_mlc.put(uri(1), data)
    assert bytes(small_mlc.get_range(uri(1), 10, 300)) == data[10:300]
    for n in (2, 3, 4):  # push uri(1) to disk
        small_mlc.put(uri(n), blob(n, 2048))
    assert tier_of(small_mlc, uri(1)) == "disk"
    assert bytes(small_mlc.get_range(uri(1), 1, 5)) == data[1:5]
    assert bytes(small_mlc.get_range(uri(1), 0, 2048)) == data
    assert tier_of(small_mlc, uri(1)) == "disk", "a range read does not promote"
    with pytest.raises(BadRange):
        small_mlc.get_range(uri(1), 100, 5000)


def test_head_and_etag_change_on_replace(small_mlc):
    first = small_mlc.put(uri(1), b"a")
    head = small_mlc.head(uri(1))
    assert (head.size, head.etag, head.leased) == (1, first.etag, False)
    second = small_mlc.put(uri(1), b"bb")
    assert second.etag != first.etag and small_mlc.head(uri(1)).size == 2


def test_missing_object_fails_clearly_and_counts_a_miss(small_mlc):
    with pytest.raises(ObjectUnavailable) as exc:
        small_mlc.get(uri(9))
    assert exc.value.status == 404 and "not in the cache" in exc.value.detail
    assert small_mlc.stats()["scopes"][SCOPE.hex()]["-"]["misses"] == 1


def test_writes_go_to_fastest_tier_and_lru_demotes_under_pressure(small_mlc):
    for n in (1, 2):
        small_mlc.put(uri(n), blob(n, 2048))
    assert [tier_of(small_mlc, uri(n)) for n in (1, 2)] == ["host", "host"]
    small_mlc.get(uri(1))  # uri(2) is now least recently used
    small_mlc.put(uri(3), blob(3, 2048))
    assert [tier_of(small_mlc, uri(n)) for n in (1, 2, 3)] == ["host", "disk", "host"]
    assert bytes(small_mlc.get(uri(2))) == blob(2, 2048), "reads promote back up"
    assert tier_of(small_mlc, uri(2)) == "host"


def test_lru_evicts_off_the_last_tier(small_mlc):
    for n in range(1, 7):  # 6 x 2 KiB into 4 + 8 KiB
        small_mlc.put(uri(n), blob(n, 2048))
    small_mlc.put(uri(7), blob(7, 2048))
    assert not small_mlc.contains(uri(1)), "oldest object falls off the disk tier"
    assert all(small_mlc.contains(uri(n)) for n in range(2, 8))
    assert small_mlc.stats()["scopes"][SCOPE.hex()]["disk"]["evictions"] == 1


def test_leased_object_is_never_evicted_demoted_or_deleted(small_mlc):
    small_mlc.put(uri(1), blob(1, 2048), lease_ttl=30)
    with pytest.raises(ObjectLeased):
        small_mlc.delete(uri(1))
    with pytest.raises(ObjectLeased):
        small_mlc.put(uri(1), b"replace")
    for n in range(2, 12):
        small_mlc.put(uri(n), blob(n, 2048))
    assert tier_of(small_mlc, uri(1)) == "host"
    assert bytes(small_mlc.get(uri(1))) == blob(1, 2048)


def test_full_of_leases_refuses_new_objects(small_mlc):
    for n in range(6):
        small_mlc.put(uri(n), blob(n, 2048), lease_ttl=30)
    with pytest.raises(CacheFull):
        small_mlc.put(uri(7), blob(7, 2048))


def test_expired_lease_reclaims_object_put_under_it(small_mlc, clock):
    stored = small_mlc.put(uri(1), b"q", lease_ttl=5)
    clock.advance(4.9)
    assert bytes(small_mlc.get(uri(1))) == b"q"
    small_mlc.renew(stored.lease, 5)
    clock.advance(4.9)
    assert small_mlc.contains(uri(1)), "renewal moved the expiry"
    clock.advance(0.2)
    with pytest.raises(ObjectUnavailable):
        small_mlc.get(uri(1))
    with pytest.raises(UnknownLease):
        small_mlc.renew(stored.lease, 5)


def test_released_object_stays_until_lru_and_becomes_deletable(small_mlc, clock):
    stored = small_mlc.put(uri(1), b"q", lease_ttl=5)
    small_mlc.release(stored.lease)
    clock.advance(60)
    assert bytes(small_mlc.get(uri(1))) == b"q"
    small_mlc.delete(uri(1))
    assert not small_mlc.contains(uri(1))


def test_a_birth_lease_released_with_drop_deletes_its_spent_object(small_mlc, clock):
    stored = small_mlc.put(uri(1), b"q", lease_ttl=5)
    small_mlc.release(stored.lease, drop=True)
    assert not small_mlc.contains(uri(1))
    assert small_mlc.stats()["leases"] == 0


def test_a_dropped_object_waits_for_its_other_leases(small_mlc, clock):
    stored = small_mlc.put(uri(1), b"q", lease_ttl=5)
    verifier = small_mlc.lease(uri(1), 20)
    small_mlc.release(stored.lease, drop=True)
    assert bytes(small_mlc.get(uri(1))) == b"q", "another holder still reads it"
    small_mlc.release(verifier)
    assert not small_mlc.contains(uri(1))
    # Dropped while another lease holds it, then that lease expires: gone too.
    stored = small_mlc.put(uri(2), b"q", lease_ttl=5)
    small_mlc.lease(uri(2), 10)
    small_mlc.release(stored.lease, drop=True)
    clock.advance(11)
    assert not small_mlc.contains(uri(2))


def test_drop_on_a_lease_that_is_not_the_birth_lease_only_unpins(small_mlc, clock):
    small_mlc.put(uri(1), b"q")
    extra = small_mlc.lease(uri(1), 5)
    small_mlc.release(extra, drop=True)
    assert bytes(small_mlc.get(uri(1))) == b"q"


def test_second_lease_keeps_object_when_first_expires(small_mlc, clock):
    stored = small_mlc.put(uri(1), b"q", lease_ttl=5)
    verifier = small_mlc.lease(uri(1), 20)
    clock.advance(10)
    assert small_mlc.head(uri(1)).leased
    small_mlc.release(verifier)
    assert small_mlc.contains(uri(1)) and not small_mlc.head(uri(1)).leased
    with pytest.raises(UnknownLease):
        small_mlc.release(stored.lease)


def test_lease_on_missing_object_fails(small_mlc):
    with pytest.raises(ObjectUnavailable):
        small_mlc.lease(uri(1), 5)


def test_accounting_per_scope_and_tier(small_mlc):
    small_mlc.put(uri(1), blob(1, 1000))
    small_mlc.put(uri(2, OTHER), blob(2, 3000))
    small_mlc.get(uri(1))
    small_mlc.get(uri(1))
    scopes = small_mlc.stats()["scopes"]
    assert scopes[SCOPE.hex()]["host"] == {"bytes": 1000, "objects": 1, "hits": 2, "misses": 0, "evictions": 0}
    assert scopes[OTHER.hex()]["host"]["bytes"] == 3000
    small_mlc.delete(uri(2, OTHER))
    assert small_mlc.stats()["scopes"][OTHER.hex()]["host"]["objects"] == 0


def test_prefetch_promotes_in_background(small_mlc):
    for n in range(1, 5):
        small_mlc.put(uri(n), blob(n, 2048))
    assert tier_of(small_mlc, uri(1)) == "disk"
    assert small_mlc.prefetch([uri(1), uri(99)]).result(timeout=5) == [True, False]
    assert tier_of(small_mlc, uri(1)) == "host"


def test_held_view_survives_delete_and_buffer_reuse(small_mlc):
    small_mlc.put(uri(1), blob(1, 1024))
    view = small_mlc.get(uri(1))
    small_mlc.delete(uri(1))
    small_mlc.put(uri(2), blob(2, 1024))  # same size: would reuse a pooled buffer
    assert bytes(view) == blob(1, 1024)


def test_unshared_buffers_are_reused(small_mlc):
    host = small_mlc.tiers[0]
    small_mlc.put(uri(1), bytearray(blob(1, 1024)))  # copied into a buffer of the tier's (bytes may be kept as they are)
    small_mlc.delete(uri(1))
    assert host._pooled == 1024, "a buffer nobody views goes back to the pool"


def test_tensor_roundtrip_keeps_dtype_and_shape(small_mlc):
    torch = pytest.importorskip("torch")
    rows = torch.arange(24, dtype=torch.float32).reshape(2, 12)
    small_mlc.put(uri(1), rows)
    back = small_mlc.get_tensor(uri(1))
    assert back.dtype == torch.float32 and back.shape == (2, 12)
    assert torch.equal(back, rows)


def test_bad_names_are_refused(small_mlc):
    with pytest.raises(ValueError):
        small_mlc.put("has space", b"x")


def test_get_into_copies_from_every_tier_without_moving(small_mlc):
    data = bytes(range(256)) * 8
    small_mlc.put(uri(1), data)
    out = bytearray(3000)
    assert small_mlc.get_into(uri(1), out) == 2048 and bytes(out[:2048]) == data
    for n in (2, 3, 4):
        small_mlc.put(uri(n), blob(n, 2048))
    assert tier_of(small_mlc, uri(1)) == "disk"
    out = bytearray(2048)
    assert small_mlc.get_into(uri(1), memoryview(out)) == 2048 and bytes(out) == data
    assert tier_of(small_mlc, uri(1)) == "disk"
    with pytest.raises(BadRange):
        small_mlc.get_into(uri(1), bytearray(100))
    with pytest.raises(ValueError):
        small_mlc.get_into(uri(1), b"readonly" * 300)


def test_reading_from_a_full_lower_tier_swaps_instead_of_evicting_a_third_object(tmp_path, clock):
    with MLC([HostTier(200 << 10), DiskTier(200 << 10, str(tmp_path))], clock=clock) as mlc:
        for n in range(4):  # 0 and 1 end on the disk, 2 and 3 on the host: both full
            mlc.put(uri(n), blob(n, 100 << 10))
        assert [tier_of(mlc, uri(n)) for n in range(4)] == ["disk", "disk", "host", "host"]
        assert bytes(mlc.get(uri(0))) == blob(0, 100 << 10)
        assert [mlc.contains(uri(n)) for n in range(4)] == [True] * 4, "the read evicted an object"
        assert [tier_of(mlc, uri(n)) for n in range(4)] == ["host", "disk", "disk", "host"]
        stats = mlc.stats()
        assert [t["used"] for t in stats["tiers"]] == [200 << 10, 200 << 10]
        assert sum(c["evictions"] for tiers in stats["scopes"].values() for c in tiers.values()) == 0


def test_bytes_are_kept_as_they_came_on_a_host_tier_without_cuda(small_mlc):
    """An immutable ``bytes`` object (a request body at the MLC server) is stored without a
    copy where the host tier needs no pinned buffers; a bytearray is still copied."""
    host = small_mlc.tiers[0]
    data = blob(3, 2048)
    assert small_mlc.stores_as_is(data, len(data)) == host.adopts_bytes
    small_mlc.put(uri(1), data)
    view = small_mlc.get(uri(1))
    assert bytes(view) == data and (view.obj is data) == host.adopts_bytes
    assert not small_mlc.stores_as_is(bytearray(data), len(data))
    assert not small_mlc.stores_as_is(data, 4096), "no room beside what the tier holds: the put moves objects"
    # Moved down to disk and back, deleted: the kept bytes are never handed out for reuse.
    small_mlc.put(uri(2), blob(4, 3000))
    assert tier_of(small_mlc, uri(1)) == "disk" and bytes(small_mlc.get(uri(1))) == data
    small_mlc.delete(uri(1))
    small_mlc.delete(uri(2))
    small_mlc.put(uri(5), bytearray(2048))
    assert data == blob(3, 2048)


def test_reads_as_view_only_where_a_read_neither_copies_nor_moves(small_mlc):
    small_mlc.put(uri(1), blob(1, 2048))
    assert small_mlc.reads_as_view(small_mlc.head(uri(1)))
    small_mlc.put(uri(2), blob(2, 3000))  # uri(1) moves down to disk
    assert tier_of(small_mlc, uri(1)) == "disk"
    assert not small_mlc.reads_as_view(small_mlc.head(uri(1))), "a read promotes it first"
