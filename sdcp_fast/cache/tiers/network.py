"""Networked tier on Redis (see docs/mlc.md for why Redis rather than Mooncake Store here).

Objects are plain string values under ``<prefix><uri>``; several MLC instances that share a
server and prefix see each other's objects (``probe``), which is the many-machines path for
bytes that do not fit a node's own tiers.
"""

from __future__ import annotations

from typing import Any

from sdcp_fast.cache.tiers.base import as_bytes_view


class RedisTier:
    host_readable = True

    def __init__(self, capacity: int, url: str, *, prefix: str = "mlc:", name: str = "redis") -> None:
        import redis

        self.name = name
        self.capacity = capacity
        self.prefix = prefix
        self.url = url
        self._r = redis.Redis.from_url(url)
        self._r.ping()

    def write(self, key: str, data: Any) -> str:
        name = self.prefix + key
        self._r.set(name, as_bytes_view(data))
        return name

    def read(self, handle: str) -> memoryview:
        value = self._r.get(handle)
        if value is None:
            raise KeyError(handle)
        return memoryview(bytes(value))  # type: ignore[arg-type]

    def read_range(self, handle: str, start: int, stop: int) -> memoryview:
        if stop <= start:
            return memoryview(b"")
        return memoryview(bytes(self._r.getrange(handle, start, stop - 1)))  # type: ignore[arg-type]

    def probe(self, key: str) -> int | None:
        """Size of an object another instance left here, or None."""
        name = self.prefix + key
        if not self._r.exists(name):
            return None
        return int(self._r.strlen(name))

    def drop(self, handle: str) -> None:
        self._r.delete(handle)

    def close(self) -> None:
        self._r.close()
