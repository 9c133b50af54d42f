"""The networked tier against a real redis-server started on loopback."""

from __future__ import annotations

import pytest

from sdcp_fast.cache import MLC, ObjectUnavailable, object_uri
from sdcp_fast.cache.tiers.host import HostTier
from sdcp_fast.cache.tiers.network import RedisTier
from tests.cache.mlc_redis import running_redis

pytestmark = pytest.mark.services
SCOPE = bytes(range(16))


def uri(n: int) -> str:
    return object_uri(SCOPE, b"s" * 16, "draft_kv", n)


@pytest.fixture(scope="module")
def redis_url():
    with running_redis() as url:
        yield url


def blob(n: int, size: int = 2048) -> bytes:
    return bytes([n]) * size


def test_demotion_to_redis_and_promotion_back(redis_url, clock):
    mlc = MLC([HostTier(4096), RedisTier(1 << 20, redis_url, prefix="t1:")], clock=clock)
    try:
        for n in range(1, 4):
            mlc.put(uri(n), blob(n))
        assert mlc.head(uri(1)).tier == "redis"
        assert bytes(mlc.get_range(uri(1), 100, 200)) == blob(1)[100:200]
        assert bytes(mlc.get(uri(1))) == blob(1)
        assert mlc.head(uri(1)).tier == "host"
        assert mlc.stats()["scopes"][SCOPE.hex()]["redis"]["objects"] == 1
    finally:
        mlc.close()


def test_objects_too_big_for_host_go_straight_to_redis(redis_url, clock):
    mlc = MLC([HostTier(1024), RedisTier(1 << 20, redis_url, prefix="t2:")], clock=clock)
    try:
        mlc.put(uri(1), blob(7, 4096))
        assert mlc.head(uri(1)).tier == "redis"
        mlc.delete(uri(1))
        with pytest.raises(ObjectUnavailable):
            mlc.get(uri(1))
    finally:
        mlc.close()


def test_second_instance_sees_objects_left_in_shared_tier(redis_url, clock):
    """Two MLC instances (two machines) sharing one networked tier."""
    tier_a = RedisTier(1 << 20, redis_url, prefix="shared:")
    a = MLC([HostTier(1024), tier_a], clock=clock)
    b = MLC([HostTier(1 << 20), RedisTier(1 << 20, redis_url, prefix="shared:")], clock=clock)
    try:
        a.put(uri(1), blob(3, 4096))  # too big for a's host tier: lands in Redis
        assert bytes(b.get(uri(1))) == blob(3, 4096)
        assert b.head(uri(1)).tier == "host", "b promoted its copy"
        assert bytes(a.get_range(uri(1), 0, 16)) == blob(3, 16), "the shared copy stays for its owner"
        a.delete(uri(1))
        with pytest.raises(ObjectUnavailable):
            MLC([HostTier(1024), RedisTier(1 << 20, redis_url, prefix="shared:")], clock=clock).get(uri(1))
    finally:
        b.close()
        a.close()
