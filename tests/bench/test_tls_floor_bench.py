"""bench/tls_floor.py's shortest run: every carrier (TCP, blocking TLS 1.3, the event loop's
TLS with a plain and a buffered receiver) moves messages between two processes and reports its
CPU per message and the rule-2 floor. It checks that each mode ran and reported, never how fast."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "tls_floor.py"


def test_shortest_run_reports_every_mode() -> None:
    done = subprocess.run([sys.executable, str(BENCH), "--size", "65536", "--seconds", "0.2", "--repeats", "1"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    for mode in ("tcp", "ssl", "asyncio", "asyncio-buffered"):
        line = next((ln for ln in done.stdout.splitlines() if ln.split() and ln.split()[0] == mode), None)
        assert line is not None, done.stdout
        assert re.search(r"send +\d+, receive +\d+", line) and "rule-2 floor" in line, line
