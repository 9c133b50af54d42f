"""bench/protocol.py's deployment goal (``--up-streams N``): ``sdcp-fast up --model toy`` with
N concurrent streamed completions through the front end, and the verifiers' CPU (``/proc``
utime + stime) over each batch of streams per round they committed (``sdcp_rounds_total``
of their metrics): session set-up, scoring the toy model and the rounds together. Beside it,
the same CPU split between the verifiers' main threads (the event loop: handlers, scoring,
commits) and their other threads (the native I/O thread, a scoring thread where passes are
offloaded), and the rounds each verifier committed (sessions spread over both verifiers make
smaller batches)."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from protocol import cpu_seconds

from sdcp_fast.deploy.up import Up


def _rounds(up: Up, endpoints: dict[str, str], name: str) -> float:
    """The verifier's committed rounds so far, from its metrics (curl: HTTP/2 + its client certificate)."""
    out = subprocess.run(["curl", "-sS", "--http2", "--cacert", endpoints["ca"], "--cert", endpoints["client_cert"],
                          "--key", endpoints["client_key"], up.services[name].uri + "metrics"],
                         capture_output=True, text=True, timeout=30, check=True).stdout
    return sum(float(line.split()[-1]) for line in out.splitlines() if line.startswith("sdcp_rounds_total"))


def _thread_cpu(pid: int) -> dict[int, float]:
    """CPU seconds (utime + stime) of each of a process's threads (Linux ``/proc``)."""
    out: dict[int, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended
            continue
        out[int(task.name)] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return out


def _stream(endpoints: dict[str, str], prompt: str, tokens: int) -> int:
    """One streamed completion through the front end; the events it got."""
    body = json.dumps({"model": "toy", "prompt": prompt, "max_tokens": tokens, "stream": True})
    out = subprocess.run(["curl", "-sS", "-N", "-H", f"Authorization: Bearer {endpoints['api_key']}", "-d", body,
                          endpoints["frontend"] + "completions"], capture_output=True, text=True, timeout=600).stdout
    return out.count("data:")


def up_cpu(streams: int, tokens: int, repeats: int) -> list[dict[str, Any]]:
    """``repeats`` batches of ``streams`` concurrent completions of ``tokens`` tokens each, on
    one deployment; per batch the verifiers' CPU microseconds per committed round."""
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as directory:
        up = Up(Path(directory), model="toy")
        try:
            up.start(timeout=300)
            endpoints = up.endpoints()
            names = [n for n in up.services if n.startswith("verifier")]
            pids = {n: up.services[n].process.pid for n in names}  # type: ignore[union-attr]
            for repeat in range(repeats):
                cpu0, rounds0 = {n: cpu_seconds(p) for n, p in pids.items()}, {n: _rounds(up, endpoints, n) for n in names}
                threads0 = {n: _thread_cpu(p) for n, p in pids.items()}
                t0 = time.perf_counter()
                prompts = [f"stream {i} of {repeat} says" for i in range(streams)]
                with ThreadPoolExecutor(streams) as pool:
                    events = sum(pool.map(lambda prompt: _stream(endpoints, prompt, tokens), prompts))
                elapsed = time.perf_counter() - t0
                cpu = sum(cpu_seconds(p) - cpu0[n] for n, p in pids.items())
                by_verifier = {n: _rounds(up, endpoints, n) - rounds0[n] for n in names}
                rounds = sum(by_verifier.values())
                main = sum(_thread_cpu(p).get(p, 0.0) - threads0[n].get(p, 0.0) for n, p in pids.items())
                rows.append({"repeat": repeat, "streams": streams, "tokens": tokens, "seconds": elapsed,
                             "rounds": rounds, "events": events, "verifier_cpu_s": cpu,
                             "verifier_us_per_round": cpu / max(rounds, 1) * 1e6, "load": os.getloadavg()[0],
                             "main_thread_us_per_round": main / max(rounds, 1) * 1e6,
                             "other_threads_us_per_round": (cpu - main) / max(rounds, 1) * 1e6,
                             "rounds_by_verifier": by_verifier})
        finally:
            up.stop()
    return rows
