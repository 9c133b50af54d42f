"""Networked tier on Redis, the alternative to Mooncake Store (tiers/mooncake.py).

Objects are plain string values under ``<prefix><uri>``; several MLC instances that share a
server and prefix see each other's objects (``probe``), which is the many-machines path for
bytes that do not fit a node's own tiers.
"""

from __future__ import annotations

from typing import Any

from sdcp_fast.cache.tiers.tier import TierUnreachable, as_bytes_view


class RedisTier:
    host_readable = True
    outlives_host = True  # a server on another host keeps what a takeover reads (cache/index.py)

    def __init__(self, capacity: int, url: str, *, prefix: str = "mlc:", name: str = "redis") -> None:
        import redis

        self.name = name
        self.capacity = capacity
        self.prefix = prefix
        self.url = url
        self._redis = redis.exceptions
        self._r = redis.Redis.from_url(url)
        self._r.ping()
        self._pending: list[str] = []

    # Drops are deferred to the next command and sent in its pipeline, so replacing or
    # evicting an object during a put costs no extra round trip. The MLC flushes at the start
    # of each operation and after a delete, so other instances never see a deleted object.
    def _run(self, *commands: tuple[str, tuple[Any, ...]], keep: str | None = None) -> list[Any]:
        pipe = self._r.pipeline(transaction=False)
        for name in self._pending:
            if name != keep:
                pipe.delete(name)
        dropped = len(self._pending) - (keep in self._pending)
        self._pending.clear()
        for method, args in commands:
            getattr(pipe, method)(*args)
        try:
            return list(pipe.execute())[dropped:]
        except (self._redis.ConnectionError, self._redis.TimeoutError) as exc:
            raise TierUnreachable(f"Redis at {self.url}: {exc}") from exc

    def write(self, key: str, data: Any) -> str:
        name = self.prefix + key
        self._run(("set", (name, as_bytes_view(data))), keep=name)
        return name

    def read(self, handle: str) -> memoryview:
        (value,) = self._run(("get", (handle,)))
        if value is None:
            raise KeyError(handle)
        return memoryview(value)

    def read_range(self, handle: str, start: int, stop: int) -> memoryview:
        if stop <= start:
            return memoryview(b"")
        (value,) = self._run(("getrange", (handle, start, stop - 1)))
        return memoryview(value)

    def probe(self, key: str) -> int | None:
        """Size of an object another instance left here, or None."""
        name = self.prefix + key
        exists, size = self._run(("exists", (name,)), ("strlen", (name,)))
        return int(size) if exists else None

    def drop(self, handle: str) -> None:
        self._pending.append(handle)

    def flush(self) -> None:
        """Send deferred drops now (the MLC calls this where no write follows)."""
        if self._pending:
            self._run()

    def close(self) -> None:
        try:
            self.flush()
        except TierUnreachable:
            pass  # nothing left to drop from
        finally:
            self._r.close()
