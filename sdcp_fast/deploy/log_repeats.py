"""Repeated log lines, shown once per window: a role that cannot reach its router while that
starts, or a store that is down, would otherwise write the same warning many times a second.

A record's kind is its logger, level, message template and first argument (the peer, or the
session id: the lines of two sessions never hide each other). The first of a kind passes; the
same kind again within ``window`` seconds is counted and dropped; the first after the window
passes and says how many were dropped. Records below WARNING always pass.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

KINDS_KEPT = 4096  # kinds remembered at most (the oldest are forgotten first)


class RepeatLimiter(logging.Filter):
    def __init__(self, window: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.window = window
        self.clock = clock
        self._seen: dict[tuple[str, int, str, str], list[float]] = {}  # kind -> [shown at, dropped since]

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        args = record.args if isinstance(record.args, tuple) else ()
        kind = (record.name, record.levelno, str(record.msg), str(args[0])[:200] if args else "")
        now = self.clock()
        seen = self._seen.get(kind)
        if seen is not None and now - seen[0] < self.window:
            seen[1] += 1
            return False
        if seen is not None and seen[1]:
            record.msg = f"{record.msg} [{int(seen[1])} more like this in the last {self.window:.0f} s not shown]"
        self._seen.pop(kind, None)
        self._seen[kind] = [now, 0]
        if len(self._seen) > KINDS_KEPT:
            del self._seen[next(iter(self._seen))]
        return True
