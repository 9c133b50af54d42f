"""bench/protocol.py's shortest run in CI: the MLC, verifier and drafter processes over HTTP/2
+ mutual TLS, rules 1 and 2 at two concurrency levels, the per-round exchange counts at two
session lengths, the echo baseline and the core. It checks that every part ran and reported,
never how fast."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "protocol.py"


def test_shortest_run_reports_every_level_rule_and_window(tmp_path: Path) -> None:
    out = tmp_path / "protocol.json"
    done = subprocess.run(
        [sys.executable, str(BENCH), "--seconds", "0.5", "--concurrency", "1", "4", "--drafters", "2",
         "--long", "60", "--window", "16", "--core-rounds", "200", "--session-tokens", "64", "--json", str(out)],
        capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(out.read_text())
    assert {(r["rule"], r["concurrency"]) for r in got["levels"]} == {(1, 1), (2, 1), (1, 4), (2, 4)}
    for row in got["levels"]:
        assert row["rounds"] > 0 and row["p99_ms"] >= row["p50_ms"] > 0
        # What a round commits, beside rounds/s: M + 1 = 5 when all is accepted, fewer where the
        # load rule cut m_cap or a session ended within the round; a read at the window's start
        # may carry a round committed just before it, so a short window may show a little more.
        assert 0 < row["tokens_per_round"] < 7
        assert set(row["cpu_us_per_round"]) == {"mlc", "verifier", "router", "drafters"}
        # Where the verifier's passes spent their time, each phase's mean per pass.
        assert row["passes"] > 0 and list(row["pass_ms"]) == ["gather", "score", "commit", "append", "release"]
        assert all(ms >= 0 for ms in row["pass_ms"].values()) and row["pass_ms"]["append"] > 0
    windows = {(r["rule"], r["committed"]): r for r in got["per_round"]}
    assert set(windows) == {(1, 10), (1, 60), (2, 10), (2, 60)}
    for (rule, _), row in windows.items():
        assert row["rounds"] > 0
        assert row["kinds"]["POST proposals"][0] == 1.0  # one proposal per round, the others counted per round
        # Rule 2 through the node's shared memory (the default): a session's rows go into one
        # slot, put at its first round and rewritten in place after (sdcp_fast/store/shm_client.py).
        assert rule == 2 or "PUT q_rows" not in row["kinds"]
        assert row["kinds"].get("PUT q_rows", [0.0])[0] < 0.5
        # Through the MLC node's shared memory (the default) the verifier finds the rows' slot by
        # name, with no request (sdcp_fast/store/shm_client.py); it asks the MLC only where that
        # fails (a slot replaced meanwhile), and over the network it GETs them every round.
        assert row["kinds"].get("GET q_rows", [0.0])[0] < 0.5
    assert got["q_rows"] == "shm"
    assert got["session_tokens"] == 64 and "sessions of 64 tokens" in done.stdout
    assert got["threads"] >= 1 and "torch threads" in done.stdout  # the services' default unless --threads
    assert [e["concurrency"] for e in got["echo"]] == [1, 4] and all(e["rps"] > 0 for e in got["echo"])
    assert got["core_us_per_round"] > 0
    assert "rounds/s" in done.stdout and "exchanges/round" in done.stdout and "echo concurrency" in done.stdout
    assert "a verifier pass" in done.stdout
