"""Per-scope, per-tier counters for metrics (bytes and objects held, hits, misses, evictions)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass


@dataclass
class Counters:
    bytes: int = 0
    objects: int = 0
    hits: int = 0
    misses: int = 0
    evictions: int = 0


class Accounting:
    def __init__(self) -> None:
        self._c: defaultdict[tuple[str, str], Counters] = defaultdict(Counters)

    def __getitem__(self, key: tuple[str, str]) -> Counters:
        return self._c[key]

    def added(self, scope: str, tier: str, size: int) -> None:
        c = self._c[scope, tier]
        c.bytes += size
        c.objects += 1

    def removed(self, scope: str, tier: str, size: int) -> None:
        c = self._c[scope, tier]
        c.bytes -= size
        c.objects -= 1

    def snapshot(self) -> dict[str, dict[str, dict[str, int]]]:
        """``{scope: {tier: counters}}``; a miss is counted under the tier ``-``."""
        out: dict[str, dict[str, dict[str, int]]] = {}
        for (scope, tier), c in sorted(self._c.items()):
            out.setdefault(scope, {})[tier] = asdict(c)
        return out
