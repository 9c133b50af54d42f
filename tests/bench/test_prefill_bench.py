"""bench/prefill.py's shortest run in CI: sessions decoding while a longer prompt arrives,
its prefill chunked and in one pass. It checks that both windows were measured and reported
for each chunk size, never how fast."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "prefill.py"


def test_shortest_run_reports_both_windows_for_each_chunk(tmp_path: Path) -> None:
    out = tmp_path / "prefill.json"
    done = subprocess.run(
        [sys.executable, str(BENCH), "--model", "tiny-target", "--sessions", "2", "--short", "8", "--prompt", "90",
         "--warmup", "1", "--tokens", "3", "--chunks", "16", "0", "--threads", "1", "--json", str(out)],
        capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(out.read_text())
    assert [r["chunk"] for r in got["runs"]] == [16, 0]
    for run in got["runs"]:
        for window in ("without", "with"):
            assert run[window]["n"] > 0 and run[window]["p99_ms"] >= run[window]["p50_ms"] > 0
        assert run["p99_ratio"] > 0 and run["ttft_s"] > 0
    chunked, whole = got["runs"]
    assert chunked["passes"] > whole["passes"]  # the prompt took several passes, beside the decoding rounds
    assert "p99 with / without" in done.stdout


def test_the_long_prompt_alone_takes_the_solo_budget(tmp_path: Path) -> None:
    out = tmp_path / "alone.json"
    done = subprocess.run(
        [sys.executable, str(BENCH), "--model", "tiny-target", "--sessions", "0", "--prompt", "90", "--chunks", "16",
         "--solo", "32", "--threads", "1", "--json", str(out)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    (run,) = json.loads(out.read_text())["runs"]
    assert run["ttft_s"] > 0 and run["with"]["n"] == 0
    assert run["passes"] == 3  # 32 + 32 + the first round's 26 (chunks of 16 would take 6 passes)
    assert "alone; the long prompt's first token after" in done.stdout
