"""The MLC's accounting (``MLC.stats()``) in Prometheus' text exposition format, for
``GET /metrics`` (written by prometheus-client)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric


class _StatsCollector:
    """One scrape's accounting as Prometheus families (prometheus-client writes the text)."""

    _FIELDS = {"bytes": "gauge", "objects": "gauge", "hits": "counter", "misses": "counter", "evictions": "counter"}

    def __init__(self, stats: dict[str, Any]) -> None:
        self.stats = stats

    def collect(self) -> Iterator[Metric]:
        stats = self.stats
        for field, kind in self._FIELDS.items():
            family = (GaugeMetricFamily if kind == "gauge" else CounterMetricFamily)(
                f"sdcp_mlc_{field}", f"MLC {field} per scope and tier", labels=["scope", "tier"])
            for scope, tiers in stats["scopes"].items():
                for tier, counters in tiers.items():
                    family.add_metric([scope, tier], counters[field])
            yield family
        for key in ("used", "capacity"):
            family = GaugeMetricFamily(f"sdcp_mlc_tier_{key}_bytes", f"bytes {key} per tier", labels=["tier"])
            for tier in stats["tiers"]:
                family.add_metric([tier["name"]], tier[key])
            yield family
        yield GaugeMetricFamily("sdcp_mlc_leases", "leases held", value=stats["leases"])
        yield GaugeMetricFamily("sdcp_mlc_index_objects", "objects in the index", value=stats["index"]["objects"])
        yield GaugeMetricFamily("sdcp_mlc_index_bytes", "bytes in the index", value=stats["index"]["bytes"])


def prometheus_text(stats: dict[str, Any]) -> str:
    """The accounting in Prometheus' text exposition format, written by prometheus-client."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_StatsCollector(stats))
    return generate_latest(registry).decode()


