"""What a takeover reads goes to the Redis tier as it goes to Mooncake Store's (the same
placement, cache/index.py), and Redis's loss reads as the tier's, not as a server fault."""

from __future__ import annotations

import pytest

from sdcp_fast.cache import MLC, ObjectUnavailable, object_uri
from sdcp_fast.cache.tiers.host import HostTier
from sdcp_fast.cache.tiers.network import RedisTier
from sdcp_fast.cache.tiers.tier import TierUnreachable
from tests.cache.mlc_redis import running_redis

pytestmark = pytest.mark.services
SCOPE = bytes(range(16))


def uri(kind: str, n: int) -> str:
    return object_uri(SCOPE, b"r" * 16, kind, n)


def test_redis_holds_what_a_takeover_reads_and_its_loss_is_503(clock):
    import redis

    with running_redis() as url:
        mlc = MLC([HostTier(1 << 20), RedisTier(1 << 20, url, prefix="p1:")], clock=clock)
        try:
            assert mlc.put(uri("target_kv", 1), b"pages").tier == "redis"
            assert mlc.put(uri("draft_kv", 1), b"draft").tier == "host"
            assert bytes(mlc.get(uri("target_kv", 1))) == b"pages"
            assert mlc.head(uri("target_kv", 1)).tier == "redis", "a read leaves it where it outlives its writer"
            redis.Redis.from_url(url).shutdown(nosave=True)
            with pytest.raises(TierUnreachable) as lost:
                mlc.get(uri("target_kv", 1))
            assert lost.value.status == 503
            assert mlc.put(uri("committed_tokens", 2), b"tokens").tier == "host", "this host keeps it instead"
            with pytest.raises(ObjectUnavailable):
                mlc.get(uri("q_rows", 3))
            assert bytes(mlc.get(uri("draft_kv", 1))) == b"draft"
        finally:
            mlc.close()
