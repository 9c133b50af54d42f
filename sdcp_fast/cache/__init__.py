"""Multi-level cache (MLC): opaque objects named by URI, with leases (draft §1.4, §6.2).

``MLC`` is the in-process cache over tiers (device, page-locked host, disk, networked);
``AsyncMLC`` and ``RemoteMLC`` (:mod:`sdcp_fast.cache.http_client`) speak the same API over HTTP
to an ``sdcp-fast mlc`` server. The cache knows nothing of commit logs: :mod:`sdcp_fast.store`
composes an MLC with the logs kept under its root (``sdcp_fast.store.embedded``). See
docs/mlc.md.
"""

from __future__ import annotations

from sdcp_fast.cache.failures import BadRange, CacheFull, ObjectLeased, ObjectUnavailable, UnknownLease
from sdcp_fast.cache.index import MLC, Clock, Head, Stored
from sdcp_fast.cache.tiers.tier import Tier
from sdcp_fast.cache.uri import object_uri, parse

__all__ = [
    "MLC", "BadRange", "CacheFull", "Clock", "Head", "MiB", "ObjectLeased", "ObjectUnavailable", "Stored",
    "Tier", "UnknownLease", "object_uri", "parse",
]

MiB = 1 << 20
