"""Soak: N concurrent sessions through ``sdcp-fast up``'s processes (toy model) for a fixed
time, with a fault injected every few seconds, in turn: the verifier holding most of its
sessions killed with -9, the one holding most stopped (SIGSTOP) past its status expiry then
continued, a drafter killed with -9, and a burst of cut and delayed connections to the
verifiers (tests/faults/faultkit.py).
Dead processes are restarted as ``sdcp-fast up`` does.

It reports sessions completed and failed, tokens committed, tokens lost (committed but not
streamed to the client, or the client's stream ending short of its log) and duplicated
(streamed twice, or a round or token committed twice in a log): both must be 0. It samples the
resident memory and open file descriptors of each role process over time (they must stay
bounded) and, at the end, the MLC leases still held once every session ended (leaked ones).

    .venv/bin/python bench/soak.py --duration 600 --sessions 8           # the long run
    .venv/bin/python bench/soak.py --duration 30 --json soak.json        # a short one

docs/measurements.md has the latest figures. tests/faults/test_soak.py runs a short soak in CI.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# The fault kit is the tests' (tests/faults/faultkit.py), imported by its full name from the
# checkout's root: putting tests/ itself on the path would let its folders hide installed packages.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.faults.faultkit import (  # noqa: E402
    Client,
    FaultUp,
    Seen,
    audit,
    holder,
    jobs,
    proc_stats,
    stop_until_failed_over,
    words,
)

FAULTS = ("kill-verifier", "stop-verifier", "kill-drafter", "cut-connections")


@dataclass
class Report:
    seconds: float = 0.0
    sessions_completed: int = 0
    sessions_failed: int = 0  # the client got an error; what it saw is still checked
    errors: dict[str, int] = field(default_factory=dict)  # the failed sessions' errors, counted
    stuck: int = 0  # of those, sessions whose stream did not end within stuck_after seconds
    tokens_committed: int = 0
    tokens_lost: int = 0
    duplicates: int = 0
    log_violations: list[str] = field(default_factory=list)
    faults: dict[str, int] = field(default_factory=dict)
    restarts: dict[str, int] = field(default_factory=dict)
    leases_at_end: int | None = None
    samples: list[dict[str, Any]] = field(default_factory=list)  # t, then name: [rss KiB, fds]

    def bounds(self) -> dict[str, dict[str, int]]:
        """First and last and largest RSS (KiB) and fd count of each role process."""
        out: dict[str, dict[str, int]] = {}
        for sample in self.samples:
            for name, value in sample.items():
                if name == "t" or value is None:
                    continue
                rss, fds = value
                b = out.setdefault(name, {"rss_first": rss, "fds_first": fds, "rss_max": rss, "fds_max": fds})
                b.update(rss_last=rss, fds_last=fds, rss_max=max(b["rss_max"], rss), fds_max=max(b["fds_max"], fds))
        return out

    def summary(self) -> dict[str, Any]:
        return {"seconds": round(self.seconds, 1), "sessions_completed": self.sessions_completed,
                "sessions_failed": self.sessions_failed, "errors": self.errors, "stuck": self.stuck, "tokens_committed": self.tokens_committed,
                "tokens_lost": self.tokens_lost, "duplicates": self.duplicates,
                "log_violations": self.log_violations, "faults": self.faults, "restarts": self.restarts,
                "leases_at_end": self.leases_at_end, "processes": self.bounds()}


def account(up: FaultUp, seen: Seen, report: Report) -> None:
    """What the client saw against what the log holds."""
    try:
        a = audit(up, seen.job.session)
    except AssertionError as exc:
        report.log_violations.append(f"{seen.job.session.hex()[:8]}: {exc}")
        report.duplicates += 1
        return
    report.tokens_committed += len(a.tokens)
    committed, streamed = words(a.tokens), seen.words
    common = 0
    while common < min(len(committed), len(streamed)) and committed[common] == streamed[common]:
        common += 1
    report.duplicates += len(streamed) - common  # streamed but not (or not there) in the log
    if seen.error is None:
        report.sessions_completed += 1
        report.tokens_lost += len(committed) - common
        if len(a.tokens) != seen.job.max_tokens:
            report.tokens_lost += seen.job.max_tokens - len(a.tokens)
    else:
        report.sessions_failed += 1
        key = seen.error[:200]
        report.errors[key] = report.errors.get(key, 0) + 1


def sample(up: FaultUp, t: float) -> dict[str, Any]:
    out: dict[str, Any] = {"t": round(t, 1)}
    for name, svc in up.services.items():
        try:
            out[name] = proc_stats(svc.process.pid) if svc.process and svc.process.poll() is None else None
        except (FileNotFoundError, ProcessLookupError):
            out[name] = None
    return out


def leases(up: FaultUp) -> int | None:
    cert, key, ca = up.role_cert("router")
    done = subprocess.run(["curl", "-sS", "--http2", "--cacert", ca, "--cert", cert, "--key", key,
                           up.mlc_url() + "/stats"], capture_output=True, text=True, timeout=10)
    try:
        return int(json.loads(done.stdout)["leases"])
    except (ValueError, KeyError):
        return None


async def fault(up: FaultUp, kind: str, rng: random.Random, live: set[bytes]) -> None:
    """One fault; a verifier's lands on the one that holds most of the soak's sessions in flight
    (``live``), not on the busiest: sessions of others can keep a verifier busy that holds none."""
    ttl = up.status_ttl_ms / 1000
    if kind == "kill-verifier":
        up.kill((await holder(up, lambda: list(live)))[0])
    elif kind == "stop-verifier":  # past its status expiry, until the router failed a session over
        name, held = await holder(up, lambda: list(live))
        await stop_until_failed_over(up, name, least=3 * ttl, deadline=60.0, sessions=held or None)
    elif kind == "kill-drafter":
        up.kill(rng.choice([n for n, s in up.services.items() if s.role == "drafter"]))
    elif kind == "cut-connections":
        up.faults(cut=0.02, delay=0.02)
        await asyncio.sleep(3.0)
        up.faults()
    await asyncio.to_thread(up.restart)


async def soak(up: FaultUp, *, duration: float, sessions: int, fault_every: float, max_tokens: int,
               seed: int, faults: tuple[str, ...] = FAULTS, sample_every: float = 2.0,
               stuck_after: float = 120.0, min_faults: int = 0) -> Report:
    """``duration`` seconds of load, and as long as it takes to inject ``min_faults`` faults
    (a loaded machine's restarts can take longer than ``fault_every``)."""
    rng = random.Random(seed)
    report = Report(faults={k: 0 for k in faults})
    client = Client(up)
    t0 = time.monotonic()
    stop_at = t0 + duration
    finished: list[Seen] = []
    live: set[bytes] = set()  # sessions in flight
    injected = asyncio.Event()

    async def worker(i: int) -> None:
        local = random.Random(seed * 1000 + i)
        while time.monotonic() < stop_at or not injected.is_set():
            [job] = jobs(local, 1, max_tokens, rule2_every=0)
            if local.random() < 0.5:  # seeded rule 2 for half of them
                job = type(job)(job.prompt, job.max_tokens, job.session, local.randrange(1 << 32))
            seen = Seen(job)
            live.add(job.session)
            try:
                finished.append(await asyncio.wait_for(client.stream(seen), stuck_after))
            except TimeoutError:
                seen.error = f"stuck: no end after {stuck_after:.0f} s"
                report.stuck += 1
                finished.append(seen)
            finally:
                live.discard(job.session)

    async def injector() -> None:
        k = 0
        try:
            while k < min_faults or time.monotonic() + fault_every < stop_at:
                await asyncio.sleep(fault_every)
                kind = faults[k % len(faults)]
                k += 1
                await fault(up, kind, rng, live)
                report.faults[kind] += 1
        finally:
            injected.set()

    async def sampler() -> None:
        while True:
            report.samples.append(sample(up, time.monotonic() - t0))
            await asyncio.sleep(sample_every)

    sampling = asyncio.create_task(sampler())
    try:
        await asyncio.gather(injector(), *(worker(i) for i in range(sessions)))
    finally:
        sampling.cancel()
        await client.close()
    report.seconds = time.monotonic() - t0
    report.samples.append(sample(up, report.seconds))
    for seen in finished:
        account(up, seen, report)
    report.restarts = {name: svc.restarts for name, svc in up.services.items()}
    report.leases_at_end = leases(up)
    return report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--duration", type=float, default=600.0, help="seconds of load (default 600)")
    p.add_argument("--sessions", type=int, default=8, help="sessions in flight at once (default 8)")
    p.add_argument("--fault-every", type=float, default=10.0, help="seconds between faults (default 10)")
    p.add_argument("--max-tokens", type=int, default=120, help="tokens per session (default 120)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--faults", default=",".join(FAULTS), help=f"comma-separated, in turn (default {','.join(FAULTS)})")
    p.add_argument("--dir", help="where the deployment lives (default: a temporary folder)")
    p.add_argument("--json", help="write the report (with every sample) here")
    args = p.parse_args(argv)
    faults = tuple(f for f in args.faults.split(",") if f)
    unknown = set(faults) - set(FAULTS)
    if unknown:
        p.error(f"unknown faults: {', '.join(sorted(unknown))}")
    directory = Path(args.dir or tempfile.mkdtemp(prefix="sdcp-soak-"))
    up = FaultUp(directory, model="toy", drafters=("toy-good", "toy-good"), status_ttl_ms=1500, seed=args.seed)
    up.start(timeout=180)
    try:
        report = asyncio.run(soak(up, duration=args.duration, sessions=args.sessions, fault_every=args.fault_every,
                                  max_tokens=args.max_tokens, seed=args.seed, faults=faults))
    finally:
        up.stop()
    summary = report.summary()
    print(json.dumps(summary, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps({**summary, "samples": report.samples}, indent=1) + "\n")
    ok = report.tokens_lost == 0 and report.duplicates == 0 and not report.log_violations
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
