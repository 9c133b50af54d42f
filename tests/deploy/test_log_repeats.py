"""deploy/log_repeats.py: the same warning once per window, then with a count; other sessions'
and other peers' lines are never hidden; info lines always pass."""

from __future__ import annotations

import logging

from sdcp_fast.deploy.log_repeats import RepeatLimiter


def record(msg: str, *args: object, level: int = logging.WARNING) -> logging.LogRecord:
    return logging.LogRecord("sdcp_fast.test", level, __file__, 1, msg, args, None)


def test_repeats_are_dropped_within_the_window_and_counted_after_it() -> None:
    now = [0.0]
    limiter = RepeatLimiter(window=10.0, clock=lambda: now[0])
    shown = []
    for i in range(130):  # an outage's worth in under a second
        now[0] = i / 200
        r = record("status report to %s failed: %s", "https://router/", "Connection refused")
        if limiter.filter(r):
            shown.append(r.getMessage())
    assert len(shown) == 1
    now[0] = 11.0
    r = record("status report to %s failed: %s", "https://router/", "Connection refused")
    assert limiter.filter(r) and "129 more like this in the last 10 s not shown" in r.getMessage()


def test_other_sessions_and_info_lines_are_never_hidden() -> None:
    limiter = RepeatLimiter(window=10.0, clock=lambda: 0.0)
    assert limiter.filter(record("session %s: failing over", "a" * 32))
    assert limiter.filter(record("session %s: failing over", "b" * 32))
    assert not limiter.filter(record("session %s: failing over", "a" * 32))
    assert all(limiter.filter(record("session %s: opened", "a" * 32, level=logging.INFO)) for _ in range(5))


def test_configure_logging_leaves_logging_someone_else_set_up_unfiltered() -> None:
    """A host program's (or pytest's) handlers get no limiter: filtering them would hide its
    records, e.g. every repeat of a warning a test looks for."""
    from sdcp_fast.deploy.service import configure_logging

    root = logging.getLogger()
    saved, level = root.handlers[:], root.level
    theirs = logging.NullHandler()
    try:
        root.handlers = [theirs]
        configure_logging("info")
        assert root.handlers == [theirs] and not theirs.filters
        root.handlers = []
        configure_logging("warning")
        (ours,) = root.handlers
        assert any(isinstance(f, RepeatLimiter) for f in ours.filters) and root.level == logging.WARNING
    finally:
        root.handlers, root.level = saved, level
