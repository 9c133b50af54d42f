"""MLC and commit-log speed, each figure next to a baseline measured in the same run.

    .venv/bin/python bench/mlc.py [--quick] [--sizes 4K,1M,64M] [--no-services] [--only http]

Memory tiers are compared with a plain memcpy into a preallocated buffer, the disk tier
with a dd-like loop (write/read in 1 MiB blocks, one file per object), the networked tier
with bare SET/GET on the same Redis, the HTTP API over HTTP/1.1 and HTTP/2 each with a bare
server of the same stack that keeps one body, commit-log appends with a bare fsync'd append (file)
and a bare etcd put, and group commit (one record to each of 64 logs at once) with the same
appends one after another. Targets: memory >= 70% of memcpy, disk >= 70% of dd, commit
appends within 2x of a bare put (ratio >= 0.5), a group at least as fast as one by one. q rows are M x V x 4 bytes: 1 MiB at M=8, V=32000.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Awaitable, Callable

import numpy as np

from sdcp_fast.cache import MLC, object_uri
from sdcp_fast.cache.tiers.disk import DiskTier
from sdcp_fast.cache.tiers.host import HostTier
from sdcp_fast.commitlog.etcd import EtcdCommitLog, EtcdGateway, _b64
from sdcp_fast.commitlog.etcd import append_many as etcd_append_many
from sdcp_fast.commitlog.file import FileCommitLog, append_group, frame
from sdcp_fast.protocol.commitlog import CommitRecord

KiB, MiB = 1 << 10, 1 << 20
SCOPE = bytes(range(16))
ROWS: list[str] = []


def parse_size(text: str) -> int:
    unit = {"K": KiB, "M": MiB}.get(text[-1].upper(), 1)
    return int(text[:-1] if unit != 1 else text) * unit


def human(n: int) -> str:
    return f"{n // MiB}M" if n >= MiB else f"{n // KiB}K"


def timed(fn: Callable[[], object], budget: float, min_reps: int = 5) -> float:
    """Median seconds per call, after one warm-up call."""
    fn()
    samples: list[float] = []
    end = time.perf_counter() + budget
    while len(samples) < min_reps or time.perf_counter() < end:
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
        if len(samples) >= 10000:
            break
    return statistics.median(samples)


def report(area: str, op: str, size: int, ours: float, base: float, target: float, base_name: str) -> None:
    """``ours``/``base`` are seconds per op; the ratio is baseline time over ours (1.0 = as fast)."""
    ratio = base / ours
    mbps = (lambda s: size / s / MiB) if size else (lambda s: 1 / s)
    unit = "MiB/s" if size else "ops/s"
    verdict = "ok" if ratio >= target else "BELOW"
    row = (f"{area:<8} {op:<14} {human(size) if size else '-':>5}  {mbps(ours):>10.1f} {unit}  "
           f"{base_name:<14} {mbps(base):>10.1f} {unit}  ratio {ratio:5.2f}  "
           f"(target {target:.2f}: {verdict})  lat {ours * 1e6:9.1f} us")
    ROWS.append(row)
    print(row, flush=True)


def bench_host(sizes: list[int], budget: float) -> None:
    mlc = MLC([HostTier(max(sizes) * 4)])
    try:
        tier = mlc.tiers[0]
        print(f"# host tier allocator: {tier.allocator} (pinned={tier.pinned})")
        for size in sizes:
            _host_size(mlc, size, budget)
    finally:
        mlc.close()


def _host_size(mlc: MLC, size: int, budget: float) -> None:
    src = np.random.default_rng(0).integers(0, 255, size, dtype=np.uint8)
    dst = np.empty_like(src)
    uri = object_uri(SCOPE, b"b" * 16, "q_rows", size)
    memcpy = timed(lambda: np.copyto(dst, src), budget)
    report("host", "put", size, timed(lambda: mlc.put(uri, src), budget), memcpy, 0.7, "memcpy")
    report("host", "get (view)", size, timed(lambda: mlc.get(uri), budget), memcpy, 0.7, "memcpy")
    report("host", "get_into", size, timed(lambda: mlc.get_into(uri, dst), budget), memcpy, 0.7, "memcpy")
    mlc.delete(uri)


def bench_disk(sizes: list[int], budget: float, root: str) -> None:
    mlc = MLC([DiskTier(max(sizes) * 4, os.path.join(root, "mlc"))])
    base_dir = os.path.join(root, "dd")
    os.makedirs(base_dir, exist_ok=True)
    try:
        for size in sizes:
            _disk_size(mlc, size, budget, os.path.join(base_dir, "obj"))
    finally:
        mlc.close()


def _disk_size(mlc: MLC, size: int, budget: float, path: str) -> None:
    block = MiB
    src = np.random.default_rng(1).integers(0, 255, size, dtype=np.uint8)
    view = memoryview(src)
    dst = np.empty_like(src)
    out = memoryview(dst)
    uri = object_uri(SCOPE, b"d" * 16, "draft_kv", size)

    seq = [0]

    def dd_write() -> None:  # a new file per object, the previous one unlinked: as the tier does
        seq[0] += 1
        fd = os.open(f"{path}.{seq[0]}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        for off in range(0, size, block):
            os.write(fd, view[off: off + block])
        os.close(fd)
        if seq[0] > 1:
            os.unlink(f"{path}.{seq[0] - 1}")

    def dd_read() -> None:
        with open(f"{path}.{seq[0]}", "rb", buffering=0) as f:
            for off in range(0, size, block):
                f.readinto(out[off: off + block])

    report("disk", "put", size, timed(lambda: mlc.put(uri, src), budget), timed(dd_write, budget), 0.7,
           "dd write")
    dd = timed(dd_read, budget)
    report("disk", "get_into", size, timed(lambda: mlc.get_into(uri, dst), budget), dd, 0.7, "dd read")
    read = timed(lambda: np.copyto(dst, np.frombuffer(mlc.get(uri), np.uint8)), budget)
    report("disk", "get+copy", size, read, dd, 0.7, "dd read")
    mlc.delete(uri)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def bench_redis(sizes: list[int], budget: float) -> None:
    binary = shutil.which("redis-server")
    if binary is None:
        print("# redis: skipped (redis-server missing; scripts/services.sh installs it)")
        return
    import redis

    from sdcp_fast.cache.tiers.network import RedisTier

    port = free_port()
    proc = subprocess.Popen([binary, "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly",
                             "no"], stdout=subprocess.DEVNULL)
    try:
        url = f"redis://127.0.0.1:{port}/0"
        client = redis.Redis.from_url(url)
        for _ in range(100):
            try:
                client.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)
        mlc = MLC([RedisTier(max(sizes) * 4, url)])
        for size in sizes:
            _redis_size(mlc, client, size, budget)
        mlc.close()
    finally:
        proc.terminate()
        proc.wait(10)


def _redis_size(mlc: MLC, client: object, size: int, budget: float) -> None:
    src = os.urandom(size)
    uri = object_uri(SCOPE, b"r" * 16, "draft_kv", size)
    base_put = timed(lambda: client.set("bare", src), budget)  # type: ignore[attr-defined]
    report("redis", "put", size, timed(lambda: mlc.put(uri, src), budget), base_put, 0.7, "bare SET")
    base_get = timed(lambda: client.get("bare"), budget)  # type: ignore[attr-defined]
    report("redis", "get", size, timed(lambda: mlc.get(uri), budget), base_get, 0.7, "bare GET")
    mlc.delete(uri)


def _serve(app: object) -> tuple[str, Callable[[], None]]:
    """Run an aiohttp app on 127.0.0.1 in a thread; returns its base URL and a stopper."""
    from aiohttp import web

    from sdcp_fast.transport.loop import LoopThread

    thread = LoopThread("bench-http")
    runner = web.AppRunner(app)  # type: ignore[arg-type]
    port = free_port()

    async def start() -> None:
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()

    thread.submit(start()).result(10)

    def stop() -> None:
        thread.submit(runner.cleanup()).result(10)
        thread.stop()

    return f"http://127.0.0.1:{port}", stop


def bench_http(sizes: list[int], budget: float) -> None:
    """The MLC's HTTP API over HTTP/1.1 (the aiohttp server) and HTTP/2 (the project's
    transport), each next to a bare server of the same stack that stores/returns one body:

    - ``http1``: the old wire, http.client keep-alive (what RemoteMLC was) -> aiohttp server;
    - ``h2``: RemoteMLC (blocking; a hop to its loop thread per call) -> HTTP/2 server;
    - ``h2-async``: AsyncMLC awaited on the caller's loop (what the role services do).
    Plain TCP on loopback (h2c) for every row: the protocols, not TLS, are compared."""
    import http.client

    from aiohttp import web

    from sdcp_fast.cache.http_client import AsyncMLC, RemoteMLC, mlc_transport
    from sdcp_fast.mlc_server.server import MLCService, serve
    from sdcp_fast.mlc_server.server_http1 import init_app
    from sdcp_fast.transport.base import Request, Response
    from sdcp_fast.transport.loop import LoopThread

    held: dict[str, bytes] = {}

    async def bare_put(request: web.Request) -> web.Response:
        held["x"] = await request.read()
        return web.Response(status=201)

    async def bare_get(request: web.Request) -> web.Response:
        return web.Response(body=held["x"])

    async def bare_h2(request: Request) -> Response:
        if request.method == "PUT":
            held["y"] = request.body
            return Response(201)
        return Response(200, held["y"])

    bare = web.Application(client_max_size=1 << 30)
    bare.router.add_put("/x", bare_put)
    bare.router.add_get("/x", bare_get)
    mlc = MLC([HostTier(max(sizes) * 8)])
    mlc_url, stop_mlc = _serve(init_app(mlc))
    bare_url, stop_bare = _serve(bare)
    server_loop = LoopThread("bench-h2-servers")

    async def start_h2() -> tuple[object, object]:
        ours = await serve(MLCService(mlc), "127.0.0.1", 0, ssl=None, insecure=True)
        from sdcp_fast.mlc_server.server import limits
        from sdcp_fast.transport.h2server import serve as serve_h2

        theirs = await serve_h2(bare_h2, "127.0.0.1", 0, ssl=None, insecure=True, limits=limits())
        return ours, theirs

    h2_ours, h2_bare = server_loop.run(start_h2())
    h2_url, h2_bare_url = f"http://127.0.0.1:{h2_ours.port}", f"http://127.0.0.1:{h2_bare.port}"  # type: ignore[attr-defined]
    client_loop = LoopThread("bench-h2-client")
    transport = client_loop.run(_make(lambda: mlc_transport(None)))
    aio = AsyncMLC(h2_url, transport)
    try:
        def connection(url: str) -> Callable[..., bytes]:
            conn = http.client.HTTPConnection("127.0.0.1", int(url.rsplit(":", 1)[1]))

            def call(method: str, path: str, body: bytes | None = None) -> bytes:
                conn.request(method, path, body=body, headers={"Content-Type": "application/octet-stream"})
                return conn.getresponse().read()

            return call

        old, bare1 = connection(mlc_url), connection(bare_url)

        def h2_bare_call(method: str, body: bytes = b"") -> bytes:
            return client_loop.run(transport.request(h2_bare_url, method, "x", body=body)).body

        def one(remote: RemoteMLC, size: int) -> None:
            src = os.urandom(size)
            uri = object_uri(SCOPE, b"h" * 16, "q_rows", size)
            path = "/objects/" + uri.removeprefix("mlc://")
            base_put = timed(lambda: bare1("PUT", "/x", src), budget)
            report("http1", "put", size, timed(lambda: old("PUT", path, src), budget), base_put, 0.7,
                   "bare aiohttp")
            base_get = timed(lambda: bare1("GET", "/x"), budget)
            report("http1", "get", size, timed(lambda: old("GET", path), budget), base_get, 0.7, "bare aiohttp")
            base_put = timed(lambda: h2_bare_call("PUT", src), budget)
            report("h2", "put", size, timed(lambda: remote.put(uri, src), budget), base_put, 0.7, "bare h2")
            base_get = timed(lambda: h2_bare_call("GET"), budget)
            report("h2", "get", size, timed(lambda: remote.get(uri), budget), base_get, 0.7, "bare h2")
            a_put = client_loop.run(_timed_async(lambda: aio.put(uri, src), budget))
            a_bare = client_loop.run(_timed_async(lambda: transport.request(h2_bare_url, "PUT", "x", body=src),
                                                  budget))
            report("h2-async", "put", size, a_put, a_bare, 0.7, "bare h2 async")
            a_get = client_loop.run(_timed_async(lambda: aio.get(uri), budget))
            a_bare = client_loop.run(_timed_async(lambda: transport.request(h2_bare_url, "GET", "x"), budget))
            report("h2-async", "get", size, a_get, a_bare, 0.7, "bare h2 async")

        with RemoteMLC(h2_url) as remote:
            for size in sizes:
                one(remote, size)
    finally:
        client_loop.run(transport.close())
        client_loop.stop()

        async def stop_h2() -> None:
            for server in (h2_ours, h2_bare):
                server.close()  # type: ignore[attr-defined]
                await server.wait_closed()  # type: ignore[attr-defined]

        server_loop.run(stop_h2())
        server_loop.stop()
        stop_mlc()
        stop_bare()
        mlc.close()


async def _make(fn: Callable[[], object]) -> object:
    return fn()


async def _timed_async(fn: Callable[[], Awaitable[object]], budget: float, min_reps: int = 5) -> float:
    """As :func:`timed`, awaiting ``fn()`` on the running loop."""
    await fn()
    samples: list[float] = []
    end = time.perf_counter() + budget
    while len(samples) < min_reps or time.perf_counter() < end:
        t0 = time.perf_counter()
        await fn()
        samples.append(time.perf_counter() - t0)
        if len(samples) >= 10000:
            break
    return statistics.median(samples)


def record(n: int) -> CommitRecord:
    return CommitRecord(epoch=1, round=n, emitted=(n, n + 1, n + 2), committed=3 * n, digest=bytes(32))


def bench_file_log(root: str, budget: float) -> None:
    log = FileCommitLog(os.path.join(root, "bench.log"))
    blob = frame(record(1))
    fd = os.open(os.path.join(root, "bare.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    state = {"etag": log.read().etag, "n": 0}

    def append() -> None:
        state["n"] += 1
        state["etag"] = log.append(record(state["n"]), state["etag"])

    def bare() -> None:
        os.write(fd, blob)
        os.fdatasync(fd)

    try:
        report("commit", "file append", 0, timed(append, budget), timed(bare, budget), 0.5, "write+fdatasync")
    finally:
        os.close(fd)
        log.close()
    logs = [FileCommitLog(os.path.join(root, f"group-{i}.log")) for i in range(GROUP)]
    try:
        bench_group("file", logs, lambda batch: append_group([(lg, r, t, frame(r)) for lg, r, t in batch]), budget)
    finally:
        for lg in logs:
            lg.close()


GROUP = 64  # logs in one group commit: a scoring pass of the verifier's default max_batch


def bench_group(kind: str, logs: list, group: Callable[[list], list], budget: float) -> None:
    """One record to each of ``logs`` as one group commit against one append after another,
    per batch (target: the group at least as fast)."""
    tags = [lg.read().etag for lg in logs]
    state = {"n": 1 << 20}

    def batch() -> list:
        state["n"] += 1
        return [(lg, record(state["n"]), tags[i]) for i, lg in enumerate(logs)]

    def together() -> None:
        for i, tag in enumerate(group(batch())):
            assert isinstance(tag, str), tag
            tags[i] = tag

    def one_by_one() -> None:
        for i, (lg, rec, tag) in enumerate(batch()):
            tags[i] = lg.append(rec, tag)

    report("commit", f"{kind} group {len(logs)}", 0, timed(together, budget, 3), timed(one_by_one, budget, 3), 1.0,
           f"{len(logs)} appends")


def bench_etcd(root: str, budget: float) -> None:
    binary = shutil.which("etcd")
    if binary is None:
        print("# etcd: skipped (etcd missing; scripts/services.sh installs etcd-server)")
        return
    client, peer = free_port(), free_port()
    data = os.path.join(root, "etcd")
    proc = subprocess.Popen([
        binary, "--name", "b", "--data-dir", data,
        "--listen-client-urls", f"http://127.0.0.1:{client}", "--advertise-client-urls", f"http://127.0.0.1:{client}",
        "--listen-peer-urls", f"http://127.0.0.1:{peer}", "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
        "--initial-cluster", f"b=http://127.0.0.1:{peer}", "--log-level", "error"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(150):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{client}/health", timeout=1) as r:
                    if b"true" in r.read():
                        break
            except OSError:
                time.sleep(0.1)
        log = EtcdCommitLog("127.0.0.1", client, "/bench/log")
        gw = EtcdGateway("127.0.0.1", client)
        value = _b64(frame(record(1)))
        state = {"etag": log.read().etag, "n": 0}

        def append() -> None:
            state["n"] += 1
            state["etag"] = log.append(record(state["n"]), state["etag"])

        def bare() -> None:
            state["n"] += 1
            gw.call("/v3/kv/put", {"key": _b64(f"/bench/bare/{state['n']:020d}"), "value": value})

        report("commit", "etcd append", 0, timed(append, budget), timed(bare, budget), 0.5, "bare etcd put")
        log.close()
        gw.close()
        logs = [EtcdCommitLog("127.0.0.1", client, f"/bench/group/{i}") for i in range(GROUP)]
        bench_group("etcd", logs, etcd_append_many, budget)
        for lg in logs:
            lg.close()
    finally:
        proc.terminate()
        proc.wait(10)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="4K,64K,1M,16M,64M")
    ap.add_argument("--quick", action="store_true", help="short time budget per figure")
    ap.add_argument("--no-services", action="store_true", help="skip Redis and etcd")
    ap.add_argument("--root", help="folder for disk figures (default: a temporary folder)")
    ap.add_argument("--only", choices=["host", "disk", "log", "http", "services"], action="append",
                    help="run only these areas (repeatable; default: all)")
    args = ap.parse_args(argv)
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    budget = 0.1 if args.quick else 0.5
    root = tempfile.mkdtemp(prefix="sdcp-bench-mlc-", dir=args.root)
    print(f"# bench/mlc.py: sizes {','.join(human(s) for s in sizes)}, {budget}s per figure, root {root}")
    try:
        areas = set(args.only or ["host", "disk", "log", "http", "services"])
        if "host" in areas:
            bench_host(sizes, budget)
        if "disk" in areas:
            bench_disk(sizes, budget, root)
        if "log" in areas:
            bench_file_log(root, budget)
        if "http" in areas:
            bench_http([s for s in sizes if s <= 16 * MiB], budget)
        if "services" in areas and not args.no_services:
            bench_redis(sizes, budget)
            bench_etcd(root, budget)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    below = [r for r in ROWS if "BELOW" in r]
    print(f"# {len(ROWS) - len(below)}/{len(ROWS)} figures meet their target")
    return 0


if __name__ == "__main__":
    sys.exit(main())
