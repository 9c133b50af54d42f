"""Multi-level cache (MLC): opaque objects named by URI, with leases (draft §1.4, §6.2).

``MLC`` is the in-process cache over tiers (device, page-locked host, disk, networked);
``embedded()`` builds the default one; ``RemoteMLC`` speaks the same API over HTTP to an
``sdcp-fast mlc`` server. The cache knows nothing of commit logs: ``sdcp_fast.embedded``
composes an MLC with the logs kept under its root. See docs/mlc.md.
"""

from __future__ import annotations

import time

from sdcp_fast.cache.errors import BadRange, CacheFull, ObjectLeased, ObjectUnavailable, UnknownLease
from sdcp_fast.cache.store import MLC, Clock, Head, Stored
from sdcp_fast.cache.tiers.base import Tier
from sdcp_fast.cache.uri import object_uri, parse

__all__ = [
    "MLC", "BadRange", "CacheFull", "Clock", "Head", "ObjectLeased", "ObjectUnavailable", "Stored",
    "Tier", "UnknownLease", "embedded", "object_uri", "parse",
]

MiB = 1 << 20


def embedded(root: str | None = None, *, host_bytes: int = 1024 * MiB, disk_bytes: int = 16384 * MiB,
             device_bytes: int = 0, redis_url: str | None = None, redis_bytes: int = 4096 * MiB,
             clock: Clock = time.monotonic, **limits: int) -> MLC:
    """The default MLC: [device,] host, disk under ``root`` (a temporary folder when None)
    [, Redis]. ``limits``: ``max_objects``, ``index_bytes``, ``max_leases`` (see MLC)."""
    from sdcp_fast.cache.tiers.disk import DiskTier
    from sdcp_fast.cache.tiers.host import HostTier

    tiers: list[Tier] = []
    if device_bytes:
        from sdcp_fast.cache.tiers.device import DeviceTier

        tiers.append(DeviceTier(device_bytes))
    tiers.append(HostTier(host_bytes))
    disk = DiskTier(disk_bytes, root)
    tiers.append(disk)
    if redis_url:
        from sdcp_fast.cache.tiers.network import RedisTier

        tiers.append(RedisTier(redis_bytes, redis_url))
    return MLC(tiers, clock=clock, **limits)
