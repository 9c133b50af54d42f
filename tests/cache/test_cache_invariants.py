"""Random operation sequences against the MLC's invariants (hypothesis)."""

from __future__ import annotations

import tempfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sdcp_fast.cache import MLC, CacheFull, ObjectLeased, ObjectUnavailable, UnknownLease, object_uri
from sdcp_fast.cache.tiers.disk import DiskTier
from sdcp_fast.cache.tiers.host import HostTier

SCOPES = [bytes([s]) * 16 for s in range(2)]
op = st.one_of(
    st.tuples(st.just("put"), st.integers(0, 7), st.integers(0, 3000), st.sampled_from([None, 1.0, 5.0])),
    st.tuples(st.just("get"), st.integers(0, 7)),
    st.tuples(st.just("delete"), st.integers(0, 7)),
    st.tuples(st.just("lease"), st.integers(0, 7), st.sampled_from([1.0, 5.0])),
    st.tuples(st.just("release"), st.integers(0, 20)),
    st.tuples(st.just("advance"), st.sampled_from([0.5, 2.0, 6.0])),
)


def name(n: int) -> str:
    return object_uri(SCOPES[n % 2], b"s" * 16, "draft_kv", n)


@settings(max_examples=150, deadline=None)
@given(st.lists(op, max_size=40))
def test_random_operations_keep_invariants(ops):
    now = [0.0]
    with tempfile.TemporaryDirectory() as root:
        mlc = MLC([HostTier(4096), DiskTier(6000, root)], clock=lambda: now[0])
        content: dict[int, bytes] = {}
        pinned_until: dict[int, float] = {}  # object -> latest lease expiry known to be held
        leases: list[tuple[str, int, float]] = []
        try:
            for step in ops:
                kind = step[0]
                if kind == "put":
                    _, n, size, ttl = step
                    data = bytes([n + 1]) * size
                    try:
                        stored = mlc.put(name(n), data, ttl)
                    except (ObjectLeased, CacheFull):
                        continue
                    content[n] = data
                    if stored.lease:
                        leases.append((stored.lease, n, now[0] + ttl))
                        pinned_until[n] = max(pinned_until.get(n, 0), now[0] + ttl)
                elif kind == "get":
                    n = step[1]
                    try:
                        got = bytes(mlc.get(name(n)))
                        assert n in content, "a deleted or never stored object reads"
                        assert got == content[n], "bytes never change under a name"
                    except ObjectUnavailable:
                        assert pinned_until.get(n, 0) <= now[0], "a leased object was lost"
                elif kind == "delete":
                    n = step[1]
                    try:
                        mlc.delete(name(n))
                    except ObjectLeased:
                        assert pinned_until.get(n, 0) > now[0], "only a held lease refuses a delete"
                        continue
                    except ObjectUnavailable:
                        content.pop(n, None)  # evicted or reclaimed before: gone either way
                        continue
                    assert pinned_until.get(n, 0) <= now[0], "a leased object was deleted"
                    content.pop(n)
                    assert not mlc.contains(name(n)), "a deleted object is gone"
                    with pytest.raises(ObjectUnavailable):
                        mlc.get(name(n))
                elif kind == "lease":
                    _, n, ttl = step
                    try:
                        lease = mlc.lease(name(n), ttl)
                    except ObjectUnavailable:
                        continue
                    leases.append((lease, n, now[0] + ttl))
                    pinned_until[n] = max(pinned_until.get(n, 0), now[0] + ttl)
                elif kind == "release" and leases:
                    lease, n, _ = leases.pop(step[1] % len(leases))
                    try:
                        mlc.release(lease)
                    except UnknownLease:
                        pass
                    pinned_until[n] = max((e for lid, m, e in leases if m == n), default=0)
                elif kind == "advance":
                    now[0] += step[1]
                stats = mlc.stats()
                for tier in stats["tiers"]:
                    assert 0 <= tier["used"] <= tier["capacity"]
                held = {t: sum(c.get(t, {}).get("bytes", 0) for c in stats["scopes"].values())
                        for t in ("host", "disk")}
                assert held == {t["name"]: t["used"] for t in stats["tiers"]}, "accounting matches the tiers"
        finally:
            mlc.close()
