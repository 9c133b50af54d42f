"""The MLC's accounting as Prometheus text (sdcp_fast/mlc_server/server_metrics.py)."""

from __future__ import annotations

from sdcp_fast.cache import MLC, object_uri
from sdcp_fast.cache.tiers.host import HostTier
from sdcp_fast.mlc_server.server_metrics import prometheus_text


def test_every_scope_and_tier_is_a_labelled_sample():
    scope = bytes(range(16))
    with MLC([HostTier(1 << 16)]) as mlc:
        uri = object_uri(scope, b"s" * 16, "q_rows", 1)
        mlc.put(uri, b"abcd")
        mlc.get(uri)
        text = prometheus_text(mlc.stats())
    assert f'sdcp_mlc_bytes{{scope="{scope.hex()}",tier="host"}} 4.0' in text
    assert f'sdcp_mlc_hits_total{{scope="{scope.hex()}",tier="host"}} 1.0' in text
    assert 'sdcp_mlc_tier_capacity_bytes{tier="host"} 65536.0' in text
    assert "# TYPE sdcp_mlc_leases gauge" in text and "sdcp_mlc_index_objects 1.0" in text
