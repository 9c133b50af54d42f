"""Echo over the SDCP transport: HTTP/2 + mTLS (ours, on h2) next to aiohttp HTTP/1.1 + mTLS.

Each server runs alone in a child process (uvloop) answering every request with its body;
this process drives it with our matching client at a few concurrency levels and reports
requests/s, p50/p99 latency, and CPU microseconds per request on each side (process CPU
time over the measured window / requests; the server's is read over the transport itself
before and after). Both servers are measured in the same run on the same machine, so the
ratio is the figure to quote; absolute numbers move with the machine's load.

    python bench/transport.py                     # ~40 s: both transports, concurrency 1, 16, 64
    python bench/transport.py --seconds 5 --concurrency 1 8 32 128 --body 4096 --json out.json
    python bench/transport.py --kinds h2-py h2-c  # the HTTP/2 framing: pure Python (h2) vs nghttp2
    python bench/transport.py --kinds h2 --repeats 5  # each point 5 times: the median, [min-max]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from sdcp_fast.protocol.peer import PeerRole
from sdcp_fast.transport import h2native
from sdcp_fast.transport.base import Request, Response, Transport
from sdcp_fast.transport.certs import InstanceSpec, write_certificates
from sdcp_fast.transport.h2client import H2Transport
from sdcp_fast.transport.h2server import serve
from sdcp_fast.transport.http1 import Http1Transport, serve_http1
from sdcp_fast.transport.loop import loop_name, run
from sdcp_fast.transport.tls import client_context, server_context

KINDS = {"h2": "HTTP/2 + mTLS (h2 adapter)", "http1": "HTTP/1.1 + mTLS (aiohttp)",
         # The same HTTP/2 transport with its framing pinned (transport/h2native.py):
         "h2-py": "HTTP/2 + mTLS, py-h2 framing", "h2-c": "HTTP/2 + mTLS, c-h2 (nghttp2)"}
ALPN = {"h2": ("h2",), "http1": ("http/1.1",), "h2-py": ("h2",), "h2-c": ("h2",)}
FRAMING = {"h2-py": h2native.PY, "h2-c": h2native.C}


async def echo(request: Request) -> Response:
    if request.path == "cpu":  # the server's own CPU seconds, for per-request cost
        return Response(200, repr(time.process_time()).encode())
    return Response(200, request.body, {"content-type": "application/sdcp+cbor"})


async def _serve_forever(kind: str, certs: Path) -> None:
    ctx = server_context(str(certs / "server.pem"), str(certs / "server.key"), str(certs / "ca.pem"),
                         alpn=ALPN[kind])
    h2native.use(FRAMING.get(kind))
    start = serve_http1 if kind == "http1" else serve
    server = await start(echo, "127.0.0.1", 0, ssl=ctx)
    print(f"PORT {server.port}", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until the parent closes stdin
    server.close()
    await server.wait_closed()


@contextlib.contextmanager
def echo_server(kind: str, certs: Path) -> Iterator[int]:
    """A child process serving :func:`echo` over ``kind`` with ``certs/server.{pem,key}``
    (see :func:`make_certs`); yields its port. For other benches' same-run baselines."""
    child = subprocess.Popen([sys.executable, __file__, "--serve", kind, "--certs", str(certs)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        yield int(child.stdout.readline().split()[1])
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait(timeout=30)


def make_certs(directory: Path) -> None:
    """``server`` (a verifier) and ``client`` (a drafter) certificates under one dev CA."""
    write_certificates(directory, [InstanceSpec("server", PeerRole.VERIFIER, "https://127.0.0.1:8501/"),
                                   InstanceSpec("client", PeerRole.DRAFTER, "https://127.0.0.1:8511/")])


def _client(kind: str, certs: Path, concurrency: int) -> Transport:
    ctx = client_context(str(certs / "client.pem"), str(certs / "client.key"), str(certs / "ca.pem"),
                         alpn=ALPN[kind])
    if kind != "http1":
        h2native.use(FRAMING.get(kind))
        return H2Transport(ctx)
    return Http1Transport(ctx, connections_per_host=concurrency)


async def measure(client: Transport, base: str, concurrency: int, seconds: float, body: bytes) -> dict[str, float]:
    """Closed loop: ``concurrency`` workers each send a request as soon as the last returns."""
    async def server_cpu() -> float:
        return float((await client.request(base, "GET", "cpu")).body)

    async def worker(until: float, latencies: list[float] | None) -> None:
        while (now := time.perf_counter()) < until:
            response = await client.request(base, "POST", "echo", body=body)
            if response.status != 200 or len(response.body) != len(body):
                raise RuntimeError(f"bad echo: {response.status}")
            if latencies is not None:
                latencies.append(time.perf_counter() - now)

    warm_until = time.perf_counter() + min(1.0, seconds / 3)
    await asyncio.gather(*(worker(warm_until, None) for _ in range(concurrency)))
    latencies: list[float] = []
    cpu0, client0, t0 = await server_cpu(), time.process_time(), time.perf_counter()
    await asyncio.gather(*(worker(t0 + seconds, latencies) for _ in range(concurrency)))
    elapsed, client_cpu = time.perf_counter() - t0, time.process_time() - client0
    server = await server_cpu() - cpu0
    n = len(latencies)
    cuts = statistics.quantiles(latencies, n=100) if n >= 2 else latencies * 99
    return {"concurrency": concurrency, "requests": n, "rps": n / elapsed, "p50_ms": cuts[49] * 1e3,
            "p99_ms": cuts[98] * 1e3, "server_us_per_req": server / n * 1e6, "client_us_per_req": client_cpu / n * 1e6}


async def _drive(kind: str, port: int, certs: Path, levels: list[int], seconds: float, body: bytes,
                 repeats: int = 1) -> list[dict]:
    rows = []
    for concurrency in levels:
        runs = []
        for _ in range(repeats):
            client = _client(kind, certs, concurrency)
            try:
                runs.append(await measure(client, f"https://127.0.0.1:{port}/", concurrency, seconds, body))
            finally:
                await client.close()
        rows.append(_median(runs))
    return rows


def _median(runs: list[dict]) -> dict:
    """Each figure's median over the runs, with its spread (``NAME_range``: min, max)."""
    row: dict = {}
    for name in runs[0]:
        values = [run[name] for run in runs]
        row[name] = values[0] if name == "concurrency" else statistics.median(values)
        if len(runs) > 1:
            row[f"{name}_range"] = (min(values), max(values))
    return row


def _spread(row: dict, name: str) -> str:
    low, high = row.get(f"{name}_range", (None, None))
    return f"{row[name]:.0f}" if low is None else f"{row[name]:.0f} [{low:.0f}-{high:.0f}]"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=3.0, help="measured seconds per point (default 3)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--body", type=int, default=512, help="request/response body bytes (default 512)")
    parser.add_argument("--kinds", nargs="+", choices=sorted(KINDS), default=["h2", "http1"])
    parser.add_argument("--repeats", type=int, default=1, help="runs per point: medians and [min-max] (default 1)")
    parser.add_argument("--json", metavar="PATH", help="also write the rows as JSON")
    parser.add_argument("--serve", choices=sorted(KINDS), help=argparse.SUPPRESS)  # the child process
    parser.add_argument("--certs", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        run(_serve_forever(args.serve, Path(args.certs)), settle=True)  # as the services' run
        return 0

    body = os.urandom(args.body)
    results: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        certs = Path(tmp)
        make_certs(certs)
        for kind in args.kinds:
            with echo_server(kind, certs) as port:
                results[kind] = run(_drive(kind, port, certs, args.concurrency, args.seconds, body, args.repeats))

    repeats = f", median of {args.repeats} runs [min-max]" if args.repeats > 1 else ""
    print(f"echo, {args.body}-byte bodies, {args.seconds:g} s per point{repeats}, {os.cpu_count()} CPUs, "
          f"{loop_name()}, server and client on the same machine, load average {os.getloadavg()[0]:.1f}")
    print(f"{'transport':30} {'conc':>5} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'server us/req':>14} "
          f"{'client us/req':>14}")
    for kind, rows in results.items():
        for row in rows:
            print(f"{KINDS[kind]:30} {row['concurrency']:>5} {row['rps']:>8.0f} {row['p50_ms']:>8.2f} "
                  f"{row['p99_ms']:>8.2f} {_spread(row, 'server_us_per_req'):>14} "
                  f"{_spread(row, 'client_us_per_req'):>14}")
    if "h2" in results and "http1" in results:
        for mine, theirs in zip(results["h2"], results["http1"], strict=True):
            print(f"concurrency {mine['concurrency']}: h2/http1 throughput x{mine['rps'] / theirs['rps']:.2f}, "
                  f"server CPU per request x{mine['server_us_per_req'] / theirs['server_us_per_req']:.2f}")
    if "h2-py" in results and "h2-c" in results:
        for mine, theirs in zip(results["h2-c"], results["h2-py"], strict=True):
            print(f"concurrency {mine['concurrency']}: c-h2/py-h2 throughput x{mine['rps'] / theirs['rps']:.2f}, "
                  f"server CPU per request x{mine['server_us_per_req'] / theirs['server_us_per_req']:.2f}, "
                  f"client x{mine['client_us_per_req'] / theirs['client_us_per_req']:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"body": args.body, "seconds": args.seconds, "results": results},
                                              indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
