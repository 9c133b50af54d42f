"""The control plane on the deployment's real path, with the model taken out: rounds per
second, verdict latency, CPU per round in each process, and HTTP exchanges and bytes per
round, next to a bare echo on the same transport measured in the same run.

What runs: an ``sdcp-fast mlc`` process (its file commit logs on disk), one verifier process
and ``--drafters`` drafter processes, each the real role (:class:`VerifierRole`,
:class:`DrafterRole`) served over HTTP/2 + mutual TLS and reaching the MLC over it too. The
scorer returns fixed logits and the drafter proposes M = 4 zeros (with q rows of V = 32,000
under rule 2), so the model costs nothing and what is left is the round itself. This process
is the router: it opens the sessions, assigns them over the drafter processes (each drafter
talks to the verifier over its own connection), and long-polls each session's output; a
finished session (256 tokens, ``--session-tokens``) is replaced by a new one, so ``concurrency``
sessions are always running. The drafters choose M as the verdicts' ``m_cap`` allows.

Per level and rule: completed rounds/s, p50/p99 verdict latency as the drafters see it
(proposal sent to verdict received), CPU microseconds per round of each process (``/proc``
utime + stime over the window), and where the verifier's scoring passes spent their time
(the mean milliseconds of each phase of ``sdcp_pass_phase_seconds``: gather, score, commit,
append, release); then the echo server of ``bench/transport.py`` at the same concurrency.
Then, with one session, the HTTP exchanges and body bytes per round by kind (every client's
requests, counted where they are sent), in a window of rounds at 10 and at ``--long``
committed tokens: what a round costs the wire, and whether that grows with the session.
Then the goals (bench/protocol_goals.py: rounds/s, verifier and MLC CPU per round, rounds over
the native echo, p99 verdict), each with its target, PASS/FAIL, its spread over ``--repeats``
and the load average, for each server of ``--servers`` measured side by side. Last, the core
alone (``VerifierSession``: receive, complete, append_done).

    python bench/protocol.py                           # ~1 min: concurrency 1 16 64 256, rules 1 and 2
    python bench/protocol.py --seconds 2 --concurrency 1 4 --long 200 --json out.json   # the CI smoke run
    python bench/protocol.py --concurrency 64 256 --servers native py --repeats 3 --long 200 --window 20 \
        --up-streams 16                                # the goals
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))

from protocol_goals import evaluate, evaluate_up, report  # noqa: E402
from transport import echo_server, make_certs, measure  # noqa: E402

from sdcp_fast.cache import object_uri  # noqa: E402
from sdcp_fast.model.interfaces import Draft  # noqa: E402
from sdcp_fast.protocol import (  # noqa: E402
    Assignment,
    Contract,
    Proposal,
    SessionOpen,
    Status,
    VerifierSession,
)
from sdcp_fast.protocol.peer import PeerRole  # noqa: E402
from sdcp_fast.protocol.routing import new_session_id  # noqa: E402
from sdcp_fast.roles.wire import SdcpClient  # noqa: E402
from sdcp_fast.transport.base import Request, Response, Transport  # noqa: E402
from sdcp_fast.transport.certs import InstanceSpec, write_certificates  # noqa: E402
from sdcp_fast.transport.h2client import H2Transport  # noqa: E402
from sdcp_fast.transport.loop import run  # noqa: E402
from sdcp_fast.transport.nativeserver import NATIVE, PY, implementation  # noqa: E402
from sdcp_fast.transport.tls import client_context, server_context  # noqa: E402

VOCAB, M = 32_000, 4
TARGET = bytes(range(32))
SCOPE = bytes(16)
SESSION_TOKENS = 256  # a session's output in the throughput runs; a new session replaces it
LOGITS = torch.zeros(VOCAB)
LOGITS[0] = 20.0  # token 0 is the argmax, and nearly all of the distribution under rule 2
Q_ROWS = torch.softmax(LOGITS, dim=-1).expand(8, VOCAB).contiguous()


class ConstantScorer:
    """Fixed logits: every proposal of zeros is accepted (rule 1 always, rule 2 nearly). The
    pass's rows come as one contiguous ``[R, V]`` tensor, as a model's head gives them (made
    once, grown when a pass needs more rows), so the kernels read real memory."""

    vocab_size = VOCAB

    def __init__(self) -> None:
        self.rows = LOGITS.expand(64, VOCAB).contiguous()

    def score(self, batch: Any) -> torch.Tensor:
        n = sum(len(r.proposal) + 1 for r in batch)
        if n > self.rows.shape[0]:
            self.rows = LOGITS.expand(2 * n, VOCAB).contiguous()
        return self.rows[:n]

    def release(self, session: bytes) -> None:
        return None


class ZeroDrafter:
    """A draft that costs nothing: M zeros, and under rule 2 the rows the scorer's logits give."""

    name = "zero"

    def propose(self, session: bytes, committed: Any, m: int, *, rule: int, **_: Any) -> Draft:
        return Draft([0] * m, Q_ROWS[:m] if rule == 2 else None)

    def release(self, session: bytes) -> None:
        return None


def exchange_kind(method: str, path: str) -> str:
    """A request's kind: the method and the resource (the object kind for the MLC's names)."""
    for kind in ("q_rows", "committed_tokens", "commit_log", "target_kv", "prompt", "leases"):
        if kind in path:
            return f"{method} {kind}"
    parts = path.strip("/").split("/")
    return f"{method} {parts[-1] if parts[0] == 'sessions' else parts[0]}"


class Counted:
    """A client transport that counts what it sends, by kind: exchanges, body bytes out and in;
    and the time each proposal took (the drafter's verdict latency)."""

    def __init__(self, inner: Transport) -> None:
        self.inner = inner
        self.counts: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
        self.latencies: list[float] = []

    async def request(self, base_uri: str, method: str, path: str, *, body: bytes = b"",
                      query: Mapping[str, str] | None = None, headers: Mapping[str, str] | None = None,
                      timeout: float | None = None) -> Response:
        t0 = time.perf_counter()
        response = await self.inner.request(base_uri, method, path, body=body, query=query, headers=headers,
                                            timeout=timeout)
        kind = exchange_kind(method, path)
        c = self.counts[kind]
        c[0] += 1
        c[1] += len(body)
        c[2] += len(response.body)
        if kind == "POST proposals":
            self.latencies.append(time.perf_counter() - t0)
        return response

    async def close(self) -> None:
        await self.inner.close()

    def snapshot(self, drain: bool) -> dict[str, Any]:
        out = {"counts": {k: list(v) for k, v in self.counts.items()}, "latencies": list(self.latencies)}
        if drain:
            self.latencies.clear()
        return out


def _client(certs: Path, name: str) -> H2Transport:
    """The client the services use (SDCP_CLIENT: the pure-Python one unless native is asked for)."""
    from sdcp_fast.transport.nativeclient import h2_client

    return h2_client(client_context(str(certs / f"{name}.pem"), str(certs / f"{name}.key"), str(certs / "ca.pem")))


async def _serve(kind: str, name: str, port: int, certs: Path, mlc: str, max_batch: int, batch_wait: float,
                 threads: int, address: str = "127.0.0.1") -> None:
    from sdcp_fast.store import RemoteStore
    from sdcp_fast.transport.h2server import serve

    if threads:  # as the services' --threads; unset, torch's default (one per core), as theirs
        torch.set_num_threads(threads)
    uri = f"https://{address}:{port}/"
    counted = Counted(_client(certs, name))
    store = RemoteStore(mlc, transport=counted)
    role: Any
    if kind == "verifier":
        from sdcp_fast.roles.verifier import VerifierConfig, VerifierRole

        config = VerifierConfig(uri=uri, target_digest=TARGET, backend="auto", max_batch=max_batch,
                                batch_wait=batch_wait, offload=True)
        role = VerifierRole(ConstantScorer(), config, mlc=store, transport=counted, target_kv=None)
    else:
        from sdcp_fast.roles.drafter import DrafterRole

        role = DrafterRole(ZeroDrafter(), uri=uri, mlc=store, transport=counted, fixed_m=M, offload=True)

    async def stats(request: Request) -> Response:
        out = counted.snapshot(drain=request.method == "POST")
        if kind == "verifier":
            out["phases"] = role.metrics.phase_totals()  # a pass's time by phase, so far
        return Response(200, json.dumps(out).encode())

    role.routes.add("GET", "bench", stats)
    role.routes.add("POST", "bench", stats)
    ctx = server_context(str(certs / f"{name}.pem"), str(certs / f"{name}.key"), str(certs / "ca.pem"))
    server = await serve(role.handler, address, port, ssl=ctx)
    await role.start()
    print("READY", flush=True)
    # SDCP_BENCH_PROFILE=DIR: the loop thread's CPU time by function (cProfile timed by
    # thread_time, so waiting and preemption on a loaded machine count nothing) in DIR/NAME.prof.
    profile_dir = os.environ.get("SDCP_BENCH_PROFILE")
    profiler = cProfile.Profile(time.thread_time) if profile_dir else None
    if profiler is not None:
        profiler.enable()
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until the parent closes stdin
    if profiler is not None:
        profiler.disable()
        profiler.dump_stats(os.path.join(str(profile_dir), f"{name}.prof"))
    server.close()
    await role.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    """A process's user + system CPU seconds (Linux ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Deployment:
    """The MLC, the verifier and the drafters, each its own process, under one dev CA."""

    def __init__(self, directory: Path, drafters: int, max_batch: int, batch_wait: float, threads: int) -> None:
        self.directory = directory
        self.certs = directory / "certs"
        ports = [free_port() for _ in range(2 + drafters)]
        self.mlc = f"https://127.0.0.1:{ports[0]}"
        self.verifier = f"https://127.0.0.1:{ports[1]}/"
        self.drafters = [f"https://127.0.0.1:{p}/" for p in ports[2:]]
        write_certificates(self.certs, [
            InstanceSpec("mlc", PeerRole.MLC, self.mlc + "/"), InstanceSpec("verifier", PeerRole.VERIFIER, self.verifier),
            InstanceSpec("router", PeerRole.ROUTER, "https://127.0.0.1:1/"),
            *(InstanceSpec(f"drafter-{i}", PeerRole.DRAFTER, uri) for i, uri in enumerate(self.drafters))])
        make_certs(self.certs)  # server/client for the echo baseline
        self.processes: dict[str, subprocess.Popen[str]] = {}
        self.processes["mlc"] = subprocess.Popen(
            [sys.executable, "-m", "sdcp_fast", "mlc", "--port", str(ports[0]), "--root", str(directory / "mlc"),
             "--certs", str(self.certs), "--name", "mlc", "--max-open-logs", "2048"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True)
        _wait_port(ports[0])
        names = [("verifier", "verifier", ports[1])] + [("drafter", f"drafter-{i}", p) for i, p in enumerate(ports[2:])]
        for kind, name, port in names:
            child = subprocess.Popen(
                [sys.executable, __file__, "--serve", kind, name, str(port), "--certs", str(self.certs),
                 "--mlc", self.mlc, "--max-batch", str(max_batch), "--batch-wait-ms", str(batch_wait * 1e3),
                 "--threads", str(threads)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            self.processes[name] = child
            assert child.stdout is not None
            if child.stdout.readline().strip() != "READY":
                raise RuntimeError(f"{name} did not start")

    def cpu(self) -> dict[str, float]:
        out = {name: cpu_seconds(p.pid) for name, p in self.processes.items()}
        out["router"] = time.process_time()
        return out

    def close(self) -> None:
        for name, p in self.processes.items():
            if name == "mlc":
                p.terminate()
            elif p.stdin is not None:
                p.stdin.close()
        for p in self.processes.values():
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()


def _wait_port(port: int, timeout: float = 60.0) -> None:
    until = time.monotonic() + timeout
    while time.monotonic() < until:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on port {port}")


def contract(rule: int, max_new: int) -> Contract:
    return Contract(target=TARGET, tokenizer=bytes(32), rule=rule, m_max=8, max_new=max_new, stop=(),
                    low_rounds=2, fallback=(1, 5), scope=SCOPE)


class Router:
    """This process as the router: sessions opened, assigned and followed to their end."""

    def __init__(self, deployment: Deployment, output_pace: float = 0.0) -> None:
        self.d = deployment
        self.output_pace = output_pace  # seconds between a session's output polls (0: poll again at once)
        self.counted = Counted(_client(deployment.certs, "router"))
        self.client = SdcpClient(self.counted)
        self.stats = SdcpClient(_client(deployment.certs, "router"))  # the children's counters, not counted
        self.sessions = 0
        self.open: set[bytes] = set()  # sessions opened and not yet final
        self.tokens = 0  # output tokens read, all sessions

    async def session(self, rule: int, max_new: int, on_output: Any = None) -> None:
        """One session from open to its last token (``on_output(committed)`` after each read)."""
        sid = new_session_id(os.urandom(16))
        drafter = self.d.drafters[self.sessions % len(self.d.drafters)]
        self.sessions += 1
        c, v = contract(rule, max_new), self.d.verifier
        state = await self.client.open_session(v, SessionOpen(
            session=sid, epoch=1, contract=c, prompt=(1, 2, 3), commit_log=object_uri(SCOPE, sid, "commit_log")))
        self.open.add(sid)
        assignment = Assignment(session=sid, epoch=1, contract=c, verifier=v, drafter=drafter, prompt=(1, 2, 3),
                                round=0, committed=0, digest=state.digest, m_init=M,
                                committed_tokens=object_uri(SCOPE, sid, "committed_tokens", 1))
        await self.client.put_drafter(v, assignment)
        await self.client.assign(drafter, assignment)
        start = 0
        while True:
            out = await self.client.output(v, sid, start, timeout=30.0)
            start = out.from_ + len(out.tokens)
            self.tokens += len(out.tokens)
            if on_output is not None:
                await on_output(start)
            if out.final:
                self.open.discard(sid)
                return
            if self.output_pace > 0:  # the next reply carries every round committed meanwhile
                await asyncio.sleep(self.output_pace)

    async def cancel_open(self) -> None:
        """End the sessions still running (``DELETE sessions/{id}``): their drafters stop at
        their next proposal, so the next level starts on an idle deployment."""
        for sid in list(self.open):
            with contextlib.suppress(Exception):
                await self.client.cancel(self.d.verifier, sid)
        self.open.clear()

    async def counters(self, drain: bool) -> dict[str, dict[str, Any]]:
        method = "POST" if drain else "GET"
        out = {"router": self.counted.snapshot(drain)}
        for name, base in [("verifier", self.d.verifier)] + [(f"drafter-{i}", u) for i, u in enumerate(self.d.drafters)]:
            out[name] = json.loads(bytes((await self.stats.transport.request(base, method, "bench")).body))
        return out

    async def close(self) -> None:
        await self.counted.close()
        await self.stats.transport.close()


async def throughput(router: Router, rule: int, concurrency: int, seconds: float) -> dict[str, Any]:
    """``concurrency`` sessions at all times, then ``seconds`` measured; the sessions still
    running then are cancelled.

    The level's first sessions are as far along as in a steady state of sessions of
    ``SESSION_TOKENS`` replaced at their end: their lengths spread evenly up to it, so that
    their ends, and the opens that replace them, spread out instead of coming all at once.
    The window starts a warm-up after each of them has read its first output: opening
    256 sessions at once takes seconds on a loaded machine, and a window over that burst
    measures the opens, not the rounds."""
    running = 0
    all_running = asyncio.Event()

    async def keep_one(index: int) -> None:
        first = True

        async def seen(committed: int) -> None:
            nonlocal first, running
            if first and committed > 0:
                first, running = False, running + 1
                if running == concurrency:
                    all_running.set()

        await router.session(rule, max(1, SESSION_TOKENS * (index + 1) // concurrency), seen)
        while True:
            await router.session(rule, SESSION_TOKENS)

    tasks = [asyncio.create_task(keep_one(i)) for i in range(concurrency)]
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(all_running.wait(), 60.0)
    await asyncio.sleep(min(1.0, seconds / 3))
    before = await router.counters(drain=True)
    cpu0, t0, tokens0 = router.d.cpu(), time.perf_counter(), router.tokens
    await asyncio.sleep(seconds)
    snap, cpu1, elapsed = await router.counters(drain=True), router.d.cpu(), time.perf_counter() - t0
    tokens = router.tokens - tokens0
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await router.cancel_open()
    await asyncio.sleep(0.2)  # the drafters' last proposals answered
    latencies = [x for name, s in snap.items() if name.startswith("drafter") for x in s["latencies"]]
    n = len(latencies)
    cuts = statistics.quantiles(latencies, n=100) if n >= 2 else (latencies or [0.0]) * 99
    cpu = {name: (cpu1[name] - cpu0[name]) / max(n, 1) * 1e6 for name in cpu0}
    cpu["drafters"] = sum(v for k, v in cpu.items() if k.startswith("drafter-"))
    passes, pass_ms = pass_phases(before["verifier"].get("phases", {}), snap["verifier"].get("phases", {}))
    # Tokens a round commits: M + 1 when all is accepted (rule 1 here), fewer when the verifier's
    # load rule lowers m_cap, which makes rounds cheaper and rounds/s alone flattering.
    return {"rule": rule, "concurrency": concurrency, "load": os.getloadavg()[0], "rounds": n, "rps": n / elapsed,
            "tokens_per_round": tokens / max(n, 1),
            "p50_ms": cuts[49] * 1e3,
            "p99_ms": cuts[98] * 1e3, "cpu_us_per_round": {k: v for k, v in cpu.items() if not k.startswith("drafter-")},
            "passes": passes, "pass_ms": pass_ms}


def pass_phases(before: dict[str, list[float]], after: dict[str, list[float]]) -> tuple[int, dict[str, float]]:
    """The verifier's scoring passes between two readings of its phase totals
    (``{phase: [passes, seconds]}``) and the mean milliseconds a pass spent in each phase."""
    passes = int(max((after[k][0] - before.get(k, [0, 0])[0] for k in after), default=0))
    return passes, {k: (after[k][1] - before.get(k, [0, 0])[1]) / max(passes, 1) * 1e3 for k in after}


def _totals(snap: dict[str, dict[str, Any]]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    for s in snap.values():
        for kind, (n, sent, received) in s["counts"].items():
            t = out[kind]
            t[0] += n
            t[1] += sent
            t[2] += received
    return out


async def per_round(router: Router, rule: int, committed: int, window: int = 100) -> dict[str, Any]:
    """Exchanges and bytes per round while one session's output grows from ``committed`` to
    ``committed + window`` tokens (taken where the router's long poll sees it pass).

    The counters are read while the session goes on (its drafter does not wait for the
    router), so a short window can pass whole while the first mark is read: then the window
    is taken again, twice as long, so that every row counts rounds."""
    for _ in range(4):
        row = await _window(router, rule, committed, window)
        if row is not None:
            return row
        window *= 2
    raise RuntimeError(f"no proposal was counted in a window of {window // 2} tokens at {committed}")


async def _window(router: Router, rule: int, committed: int, window: int) -> dict[str, Any] | None:
    marks: list[dict[str, list[int]]] = []

    async def on_output(length: int) -> None:
        if (not marks and length >= committed) or (len(marks) == 1 and length >= committed + window):
            marks.append(_totals(await router.counters(drain=False)))

    await router.session(rule, committed + window + 4 * M, on_output)
    before, after = marks
    rounds = after.get("POST proposals", [0, 0, 0])[0] - before.get("POST proposals", [0, 0, 0])[0]
    if rounds <= 0:
        return None
    kinds = {k: [(after[k][i] - before.get(k, [0, 0, 0])[i]) / rounds for i in range(3)] for k in after
             if after[k][0] != before.get(k, [0, 0, 0])[0]}
    return {"rule": rule, "committed": committed, "rounds": rounds, "kinds": kinds,
            "exchanges": sum(v[0] for v in kinds.values()), "bytes_sent": sum(v[1] for v in kinds.values()),
            "bytes_received": sum(v[2] for v in kinds.values()),
            "bytes_written_committed_tokens": kinds.get("PUT committed_tokens", [0, 0, 0])[1]}


def core_cost(rounds: int = 20000) -> float:
    """Microseconds of the sans-I/O core per round: receive, complete, append_done (rule 1),
    over sessions of ``SESSION_TOKENS`` tokens (a new one opened when one is done)."""
    c = contract(1, SESSION_TOKENS)
    status = Status(instance="https://127.0.0.1:2/", role=1, load=0, queue=0, ttl_ms=10_000)
    log = object_uri(SCOPE, b"s" * 16, "commit_log")
    drafter, verifier = "https://127.0.0.1:2/", "https://127.0.0.1:3/"
    elapsed, session = 0.0, None
    for _ in range(rounds):
        if session is None or session.committed + M + 1 > SESSION_TOKENS:
            session, state = VerifierSession.open(
                SessionOpen(session=b"s" * 16, epoch=1, contract=c, prompt=(1, 2, 3), commit_log=log),
                target_digest=TARGET, vocab=VOCAB)
            session.assign(Assignment(session=b"s" * 16, epoch=1, contract=c, verifier=verifier, drafter=drafter,
                                      prompt=(1, 2, 3), round=0, committed=0, digest=state.digest, m_init=M))
        proposal = Proposal(session=b"s" * 16, epoch=1, round=session.round + 1, drafter=drafter,
                            base=session.committed, base_digest=session.digest, tokens=(0,) * M, status=status)
        t0 = time.thread_time()  # CPU time: what the core costs, whatever else the machine runs
        session.receive_proposal(proposal, client=drafter, now=0.0)
        session.complete_scoring(M, 0, load=0)
        session.append_done(ok=True)
        elapsed += time.thread_time() - t0
    return elapsed / rounds * 1e6


async def echo(certs: Path, port: int, concurrency: int, seconds: float) -> dict[str, float]:
    from transport import _client as echo_client

    client = echo_client("h2", certs, concurrency)
    try:
        return await measure(client, f"https://127.0.0.1:{port}/", concurrency, seconds, b"x" * 200)
    finally:
        await client.close()


def measure_server(args: argparse.Namespace, server: str, result: dict[str, Any], per_round_too: bool) -> None:
    """Every level and rule ``--repeats`` times on one deployment served by ``server``, then
    (``per_round_too``) the per-round windows, then the echo on the same server; rows into ``result``."""
    tag = f"[{server}] " if len(args.servers) > 1 else ""
    with deployment(args) as d:
        router = Router(d, args.output_pace_ms / 1e3)

        async def levels() -> None:
            for repeat in range(args.repeats):
                for concurrency in args.concurrency:
                    for rule in args.rules:
                        row = await throughput(router, rule, concurrency, args.seconds)
                        row.update(server=server, repeat=repeat)
                        result["levels"].append(row)
                        print(f"{tag}rule {rule} concurrency {concurrency:3d}: {row['rps']:7.0f} rounds/s "
                              f"({row['tokens_per_round']:.2f} tokens each)  p50 "
                              f"{row['p50_ms']:6.2f} ms  p99 {row['p99_ms']:6.2f} ms  CPU us/round: "
                              f"{_cpu_text(row['cpu_us_per_round'])}  (load {row['load']:.1f})", flush=True)
                        if row["passes"]:
                            print(f"{tag}  a verifier pass ({row['passes']} passes, {row['rounds'] / row['passes']:.0f} "
                                  "rounds each), mean ms: " + ", ".join(f"{k} {v:.2f}" for k, v in row["pass_ms"].items())
                                  + f"; sum {sum(row['pass_ms'].values()):.2f}", flush=True)
            for rule in args.rules if per_round_too else ():
                for committed in (10, args.long):
                    row = await per_round(router, rule, committed, args.window)
                    result["per_round"].append(row)
                    print(f"rule {rule} at {committed:5d} committed tokens: {row['exchanges']:.2f} exchanges/round, "
                          f"{row['bytes_sent']:.0f} B sent, {row['bytes_received']:.0f} B received per round ("
                          + "; ".join(f"{k} {v[0]:.2f}x {v[1]:.0f}/{v[2]:.0f} B" for k, v in sorted(row["kinds"].items()))
                          + ")", flush=True)
            await router.close()

        run(levels())
        with echo_server("h2", d.certs) as port:
            for repeat in range(args.repeats):
                for concurrency in args.concurrency:
                    e = run(echo(d.certs, port, concurrency, args.seconds))
                    e.update(concurrency=concurrency, server=server, repeat=repeat, load=os.getloadavg()[0])
                    result["echo"].append(e)
                    best = max((r["rps"] for r in result["levels"] if r["concurrency"] == concurrency
                                and r["rule"] == 1 and r["server"] == server and r["repeat"] == repeat), default=0.0)
                    print(f"{tag}echo concurrency {concurrency:3d}: {e['rps']:7.0f} req/s ({e['server_us_per_req']:.0f} "
                          f"us CPU/req at the server); rule-1 rounds/s over echo req/s {best / e['rps']:.2f}", flush=True)


@contextlib.contextmanager
def deployment(args: argparse.Namespace) -> Iterator[Deployment]:
    with tempfile.TemporaryDirectory() as tmp:
        d = Deployment(Path(tmp), args.drafters, args.max_batch, args.batch_wait_ms / 1e3, args.threads)
        try:
            yield d
        finally:
            d.close()


def _cpu_text(cpu: Mapping[str, float]) -> str:
    return ", ".join(f"{k} {v:.0f}" for k, v in cpu.items())


def main(argv: list[str] | None = None) -> int:
    global SESSION_TOKENS  # read by throughput() and core_cost()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64, 256])
    parser.add_argument("--rules", type=int, nargs="+", default=[1, 2], choices=(1, 2))
    parser.add_argument("--drafters", type=int, default=4, help="drafter processes the sessions are spread over")
    parser.add_argument("--long", type=int, default=4000, help="committed tokens of the second per-round window")
    # The verifier's load is a pass's rounds over max_batch; from 70 % its load rule lowers m_cap
    # (docs/interpretations.md), and rounds of 1 token instead of M = 4 would flatter rounds/s.
    parser.add_argument("--max-batch", type=int, default=1024,
                        help="the verifier's max_batch (default 1024: a pass takes every round that came, and at "
                             "up to 256 sessions its load stays below the 70 %% from which it shortens the rounds)")
    parser.add_argument("--batch-wait-ms", type=float, default=5.0, help="as the verifier service's default")
    parser.add_argument("--threads", type=int, default=0,
                        help="torch CPU threads of the verifier and drafters (default 0: as the services' default, "
                             "torch's own, one per core)")
    parser.add_argument("--output-pace-ms", type=float, default=0.0,
                        help="the router's wait between a session's output polls (0: the next poll at once)")
    parser.add_argument("--window", type=int, default=100, help="tokens of each per-round window")
    parser.add_argument("--session-tokens", type=int, default=SESSION_TOKENS, metavar="N",
                        help="each throughput session's output, a new session opened when one ends (the goals are "
                             "set at the default: longer sessions leave out more of the sessions' set-up)")
    parser.add_argument("--core-rounds", type=int, default=20000)
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument("--repeats", type=int, default=1, help="each level measured this many times (the spread)")
    parser.add_argument("--up-streams", type=int, default=0, metavar="N",
                        help="also sdcp-fast up --model toy with N concurrent streamed completions (16: the goal), "
                             "--repeats times: the verifiers' CPU per committed round (bench/protocol_up.py)")
    parser.add_argument("--up-tokens", type=int, default=256, help="tokens of each --up-streams completion")
    parser.add_argument("--servers", nargs="+", choices=(PY, NATIVE), default=[implementation()],
                        help="the role servers measured, side by side in this run, each on its own deployment "
                             "with its own echo (default: the one SDCP_SERVER chooses)")
    parser.add_argument("--q-rows", choices=("shm", "network"), default="shm",
                        help="how objects (rule 2's q rows) reach the MLC on this host: through its shared memory "
                             "(docs/mlc.md) or over HTTP/2 + TLS")
    parser.add_argument("--hosts-rtt-ms", type=float, nargs="+", metavar="X",
                        help="the MLC, verifier and drafters on three simulated hosts (root), at each round-trip delay, "
                             "beside one host, in the same run (bench/protocol_hosts.py)")
    parser.add_argument("--serve", nargs=3, metavar=("KIND", "NAME", "PORT"), help=argparse.SUPPRESS)
    parser.add_argument("--certs", help=argparse.SUPPRESS)
    parser.add_argument("--mlc", help=argparse.SUPPRESS)
    parser.add_argument("--address", default="127.0.0.1", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    SESSION_TOKENS = max(M + 1, args.session_tokens)
    if args.serve:
        kind, name, port = args.serve
        run(_serve(kind, name, int(port), Path(args.certs), args.mlc, args.max_batch, args.batch_wait_ms / 1e3,
                   args.threads, args.address), settle=True)  # as the services' run
        return 0
    if args.q_rows == "network":  # inherited by the processes started below
        os.environ["SDCP_SHM_MIN_BYTES"] = str(1 << 62)
    if args.hosts_rtt_ms:
        from protocol_hosts import across_hosts

        return across_hosts(args)
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs; {args.drafters} drafter processes; "
          f"objects through {args.q_rows}; servers {' '.join(args.servers)}; {args.repeats} repeat(s); sessions of "
          f"{SESSION_TOKENS} tokens; torch threads {args.threads or f'{torch.get_num_threads()} (default)'}",
          flush=True)
    result: dict[str, Any] = {"load_before": os.getloadavg(), "q_rows": args.q_rows, "servers": args.servers,
                              "session_tokens": SESSION_TOKENS, "threads": args.threads or torch.get_num_threads(),
                              "levels": [], "per_round": [], "echo": []}
    for server in args.servers:
        os.environ["SDCP_SERVER"] = server  # the role and echo processes started below serve with it
        measure_server(args, server, result, per_round_too=server == args.servers[0])
    if args.up_streams:
        from protocol_up import up_cpu

        os.environ["SDCP_SERVER"] = args.servers[0]
        result["up"] = up_cpu(args.up_streams, args.up_tokens, args.repeats)
        for row in result["up"]:
            row["server"] = args.servers[0]
            print(f"sdcp-fast up --model toy, {row['streams']} streams x {row['tokens']} tokens: {row['rounds']:.0f} "
                  f"rounds in {row['seconds']:.1f} s, verifier CPU {row['verifier_us_per_round']:.0f} us per committed "
                  f"round: main thread {row['main_thread_us_per_round']:.0f}, others {row['other_threads_us_per_round']:.0f}; "
                  f"rounds by verifier {', '.join(f'{int(v)}' for v in row['rounds_by_verifier'].values())} "
                  f"(load {row['load']:.1f})", flush=True)
    echo_of = NATIVE if NATIVE in args.servers else args.servers[0]
    result["goals"] = goals = [g for server in args.servers
                               for g in evaluate(result["levels"], result["echo"], server, echo_of)]
    goals += evaluate_up(result.get("up", []))
    if goals:
        print(f"goals (median over repeats; rounds over the {echo_of} echo):\n{report(goals)}", flush=True)
    result["core_us_per_round"] = core = core_cost(args.core_rounds)
    result["load_after"] = os.getloadavg()
    print(f"core: {core:.1f} us per round (receive + complete + append_done, rule 1, M={M}; goal < 50); "
          f"load average {os.getloadavg()[0]:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
