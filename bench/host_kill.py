"""The time from a host's death to the next token a client receives, over repeated kills, on
a cluster of simulated hosts (``sdcp-fast cluster up``; root).

Each kill: a streamed completion (temperature 0) through the first front end, whose host
holds no verifier in the default layout; after ``--after`` pieces of text, every process of
the host of the session's active verifier (from its routing record in etcd) gets SIGKILL.
The figure is the time from that kill to the next piece of text the client reads; beside
it, the median gap between pieces before the kill. Each text is compared with an
uninterrupted stream of the same prompt. Then the host's node is started again
(:func:`sdcp_fast.cluster.simulate.restart`) and the next kill waits until every router
hears from it.

    sdcp-fast cluster up --dir /tmp/c --hosts 3 --model toy
    python bench/host_kill.py --dir /tmp/c --kills 10
    sdcp-fast cluster down --dir /tmp/c
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from sdcp_fast.cluster import simulate
from sdcp_fast.cluster.etcd_records import new_session, routed_sessions
from sdcp_fast.cluster.spec import ClusterSpec, load


def stream(endpoints: dict[str, Any], model: str, prompt: str, max_tokens: int,
           on_piece: Any = None) -> list[tuple[float, str]]:
    """Each piece of text of a streamed completion with the time it was read."""
    request = urllib.request.Request(endpoints["frontends"][0] + "completions", data=json.dumps(
        {"model": model, "prompt": prompt, "max_tokens": max_tokens, "stream": True, "temperature": 0}).encode(),
        headers={"Authorization": f"Bearer {endpoints['api_key']}", "Content-Type": "application/json"})
    pieces: list[tuple[float, str]] = []
    with urllib.request.urlopen(request, timeout=300) as r:
        for line in r:
            line = line.strip()
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            pieces.append((time.monotonic(), json.loads(line[6:])["choices"][0]["text"]))
            if on_piece is not None:
                on_piece(len(pieces))
    return pieces


def one_kill(directory: Path, spec: ClusterSpec, prompt: str, max_tokens: int, after: int) -> dict[str, Any]:
    endpoints = json.loads((directory / "endpoints.json").read_text())
    net = simulate.network(directory)
    before = {r.session for r in routed_sessions(spec)}
    killed: dict[str, Any] = {}

    def kill() -> None:
        mine = new_session(spec, before)
        host = spec.host_at(mine.verifier)
        killed["drafter_host"] = spec.host_at(mine.drafter) if mine.drafter else None
        killed["host"], killed["at"] = host, time.monotonic()
        net.kill(host)

    def on_piece(n: int) -> None:
        if n == after:  # off the reading thread, so that the client reads on while the record is looked up
            threading.Thread(target=kill, daemon=True).start()

    pieces = stream(endpoints, spec.model, prompt, max_tokens, on_piece)
    if "at" not in killed:
        raise RuntimeError("the stream ended before the kill")
    at = killed["at"]
    times = [t for t, _ in pieces]
    after_kill = [t for t in times if t > at]
    gaps = [b - a for a, b in zip(times, times[1:], strict=False) if b <= at]
    gap = statistics.median(gaps) if gaps else 0.0
    # Pieces already on their way when the host died can come first: the stream resumes
    # after the first gap past the kill longer than 5 ordinary ones (the fail-over).
    stall = [b for a, b in zip([at, *after_kill], after_kill, strict=False) if b - a > 5 * gap]
    return {"host": killed["host"], "drafter_host": killed["drafter_host"], "to_next_s": (after_kill[0] - at) if after_kill else None,
            "to_resume_s": (stall[0] - at) if stall else (after_kill[0] - at) if after_kill else None,
            "gap_before_s": gap, "text": "".join(p for _, p in pieces)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", required=True, type=Path, help="a folder of `sdcp-fast cluster up`")
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--max-tokens", type=int, default=160)
    parser.add_argument("--after", type=int, default=5, help="pieces of text read before the kill")
    parser.add_argument("--prompt", default="a drafter proposes many tokens")
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args(argv)
    spec = load(args.dir / "cluster.toml")
    endpoints = json.loads((args.dir / "endpoints.json").read_text())
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs; {args.kills} kills", flush=True)
    expected = "".join(p for _, p in stream(endpoints, spec.model, args.prompt, args.max_tokens))
    rows = []
    for i in range(args.kills):
        row = one_kill(args.dir, spec, args.prompt, args.max_tokens, args.after)
        row["same_text"] = row.pop("text") == expected
        rows.append(row)
        if row["to_next_s"] is None:
            print(f"kill {i + 1}: {row['host']}: no token after the kill", flush=True)
        else:
            print(f"kill {i + 1}: {row['host']} (the session's drafter on {row['drafter_host']}): next token {row['to_next_s'] * 1e3:.0f} ms after the kill, the "
                  f"stream resumed at {row['to_resume_s'] * 1e3:.0f} ms (gap between tokens before "
                  f"{row['gap_before_s'] * 1e3:.0f} ms); text {'identical' if row['same_text'] else 'DIFFERENT'}",
                  flush=True)
        t0 = time.monotonic()
        simulate.restart(args.dir, row["host"])
        print(f"  {row['host']} back and heard by every router in {time.monotonic() - t0:.1f} s", flush=True)
    times = [r["to_next_s"] for r in rows if r["to_next_s"] is not None]
    resumed = [r["to_resume_s"] for r in rows if r["to_resume_s"] is not None]
    summary = {"kills": len(rows), "p50_s": statistics.median(times) if times else None,
               "max_s": max(times) if times else None,
               "resume_p50_s": statistics.median(resumed) if resumed else None,
               "resume_max_s": max(resumed) if resumed else None,
               "identical": sum(r["same_text"] for r in rows), "load_after": os.getloadavg()}
    if times:
        print(f"host death to next token over {len(times)} kills: p50 {summary['p50_s'] * 1e3:.0f} ms, max "
              f"{summary['max_s'] * 1e3:.0f} ms; to the stream's resumption p50 {summary['resume_p50_s'] * 1e3:.0f} "
              f"ms, max {summary['resume_max_s'] * 1e3:.0f} ms")
    print(f"texts identical {summary['identical']}/{len(rows)}; load average {os.getloadavg()[0]:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "summary": summary}, indent=1) + "\n")
    return 0 if summary["identical"] == len(rows) and len(times) == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
