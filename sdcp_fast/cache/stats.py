"""Per-scope, per-tier counters for metrics (bytes and objects held, hits, misses, evictions).

Scopes are chosen by clients, so the table is bounded: at most ``max_scopes`` scopes have
rows of their own. A scope that holds objects keeps its row; one that holds none (all
deleted, or only missed) stays until a newer scope needs its place, and then its counters
are added to the row ``*`` (every scope without a row of its own). When every row belongs
to a scope holding objects, a new scope's objects and counters go to ``*`` from the start.
Sums over all rows are never lost: ``*`` only ever gains.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import asdict, dataclass, fields

OTHER = "*"
MAX_SCOPES = 1024


@dataclass
class Counters:
    bytes: int = 0
    objects: int = 0
    hits: int = 0
    misses: int = 0
    evictions: int = 0


class Accounting:
    def __init__(self, max_scopes: int = MAX_SCOPES) -> None:
        self.max_scopes = max_scopes
        self._rows: dict[str, dict[str, Counters]] = {}
        self._live: dict[str, int] = {}  # objects held, per scope with a row of its own
        self._idle: OrderedDict[str, None] = OrderedDict()  # rows of scopes holding none, oldest first

    def row(self, scope: str) -> str:
        """The row counters of ``scope`` go to: its own, or ``*`` when the table is full of
        scopes that hold objects."""
        if scope in self._live:
            if scope in self._idle:
                self._idle.move_to_end(scope)
            return scope
        if len(self._live) >= self.max_scopes:
            if not self._idle:
                return OTHER
            self._retire(next(iter(self._idle)))
        self._live[scope] = 0
        self._idle[scope] = None
        return scope

    def admit(self, scope: str) -> str:
        """One more object of ``scope``; returns the row it is counted under until it goes."""
        row = self.row(scope)
        if row != OTHER:
            self._live[row] += 1
            self._idle.pop(row, None)
        return row

    def leave(self, row: str) -> None:
        """An object counted under ``row`` (what :meth:`admit` returned) is gone."""
        if row != OTHER:
            self._live[row] -= 1
            if not self._live[row]:
                self._idle[row] = None

    def _retire(self, scope: str) -> None:
        del self._live[scope], self._idle[scope]
        for tier, c in self._rows.pop(scope, {}).items():
            into = self._counters(OTHER, tier)
            for f in fields(Counters):
                setattr(into, f.name, getattr(into, f.name) + getattr(c, f.name))

    def _counters(self, row: str, tier: str) -> Counters:
        return self._rows.setdefault(row, {}).setdefault(tier, Counters())

    def __getitem__(self, key: tuple[str, str]) -> Counters:
        scope, tier = key
        return self._counters(scope if scope == OTHER else self.row(scope), tier)

    def added(self, row: str, tier: str, size: int) -> None:
        c = self._counters(row, tier)
        c.bytes += size
        c.objects += 1

    def removed(self, row: str, tier: str, size: int) -> None:
        c = self._counters(row, tier)
        c.bytes -= size
        c.objects -= 1

    def snapshot(self) -> dict[str, dict[str, dict[str, int]]]:
        """``{scope: {tier: counters}}``; a miss is counted under the tier ``-``."""
        return {scope: {tier: asdict(c) for tier, c in sorted(tiers.items())}
                for scope, tiers in sorted(self._rows.items())}
