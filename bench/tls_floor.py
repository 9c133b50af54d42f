"""What moving bulk bytes costs on this machine, before any HTTP/2 or MLC work: loopback TCP
and TLS 1.3 (Python's ``ssl``, the project's mTLS contexts) between two processes, as CPU
microseconds per message in the sender and in the receiver, and what that allows a rule-2
round, whose q rows (M x V x 4 bytes, 512,000 B at M = 4, V = 32,000) cross TLS twice: the
drafter's put to the MLC and the verifier's get from it (two encryptions, two decryptions).

Modes, each measured in the same run and alternated ``--repeats`` times:
  tcp      plain sockets: ``sendall`` of a view, ``recv_into`` a preallocated buffer (the kernel's copies)
  ssl      blocking ``SSLSocket``: the same calls through TLS 1.3 (the crypto floor)
  asyncio  the event loop's TLS (``sslproto``, which the roles' HTTP/2 transport uses): the
           sender's stream ``write`` and ``drain``, the receiver a protocol that counts what its
           ``data_received`` gets
  asyncio-buffered  the same, the receiver a ``BufferedProtocol`` reading into one buffer kept
           for the connection

    python bench/tls_floor.py                        # 512,000-byte messages, 1.5 s per mode, 3 repeats
    python bench/tls_floor.py --size 65536 --seconds 1

"Rule-2 floor" is the most q-row rounds per second two cores could carry if the rounds did
nothing but move their rows: 2 cores / (2 x (send + receive CPU per message)). The real
round also runs the HTTP/2 framing, the MLC's store and six exchanges.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from transport import make_certs  # noqa: E402

from sdcp_fast.transport.tls import client_context, server_context  # noqa: E402

MODES = ("tcp", "ssl", "asyncio", "asyncio-buffered")


def _contexts(certs: Path, side: str) -> ssl.SSLContext:
    if side == "server":
        return server_context(str(certs / "server.pem"), str(certs / "server.key"), str(certs / "ca.pem"))
    return client_context(str(certs / "client.pem"), str(certs / "client.key"), str(certs / "ca.pem"))


def _receive_blocking(conn: socket.socket, size: int, stop_at: float) -> int:
    """Read whole messages into one preallocated buffer until the sender closes."""
    buf = bytearray(size)
    view = memoryview(buf)
    got = 0
    while True:
        n = conn.recv_into(view[got % size: size])
        if not n:
            return got // size
        got += n


def _send_blocking(conn: socket.socket, size: int, seconds: float) -> int:
    body = memoryview(os.urandom(size))
    sent = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        conn.sendall(body)
        sent += 1
    return sent


class _CountingInto(asyncio.BufferedProtocol):
    """Counts what arrives, read into one buffer kept for the connection (``sslproto`` then
    decrypts into it, instead of into a new ``bytes`` per read)."""

    def __init__(self, done: asyncio.Future[dict[str, float]], size: int) -> None:
        self.done, self.size, self.got, self.cpu = done, size, 0, 0.0
        self.buffer = bytearray(256 << 10)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.cpu = time.process_time()

    def get_buffer(self, sizehint: int) -> memoryview:
        return memoryview(self.buffer)

    def buffer_updated(self, nbytes: int) -> None:
        self.got += nbytes

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_result({"messages": self.got // self.size, "cpu_s": time.process_time() - self.cpu})


class _Counting(asyncio.Protocol):
    """Counts what arrives, as the HTTP/2 connection's ``data_received`` gets it (no buffering)."""

    def __init__(self, done: asyncio.Future[dict[str, float]], size: int) -> None:
        self.done, self.size, self.got, self.cpu = done, size, 0, 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.cpu = time.process_time()

    def data_received(self, data: bytes) -> None:
        self.got += len(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_result({"messages": self.got // self.size, "cpu_s": time.process_time() - self.cpu})


async def _send_asyncio(writer: asyncio.StreamWriter, size: int, seconds: float) -> int:
    body = os.urandom(size)
    sent = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        writer.write(body)
        await writer.drain()
        sent += 1
    writer.close()
    await writer.wait_closed()
    return sent


def serve(mode: str, port: int, certs: Path, size: int) -> None:
    """The receiving process: prints READY, then {messages, cpu_s} when the sender is done."""
    if mode.startswith("asyncio"):
        kind = _CountingInto if mode == "asyncio-buffered" else _Counting

        async def main() -> dict[str, float]:
            loop = asyncio.get_running_loop()
            done: asyncio.Future[dict[str, float]] = loop.create_future()
            server = await loop.create_server(lambda: kind(done, size), "127.0.0.1", port,
                                              ssl=_contexts(certs, "server"))
            print("READY", flush=True)
            out = await done
            server.close()
            return out

        print(json.dumps(asyncio.run(main())), flush=True)
        return
    listener = socket.create_server(("127.0.0.1", port))
    print("READY", flush=True)
    raw, _ = listener.accept()
    conn = _contexts(certs, "server").wrap_socket(raw, server_side=True) if mode == "ssl" else raw
    cpu = time.process_time()
    n = _receive_blocking(conn, size, 0)
    print(json.dumps({"messages": n, "cpu_s": time.process_time() - cpu}), flush=True)
    conn.close()


def send(mode: str, port: int, certs: Path, size: int, seconds: float) -> dict[str, float]:
    if mode.startswith("asyncio"):
        async def main() -> dict[str, float]:
            reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=_contexts(certs, "client"),
                                                          server_hostname="127.0.0.1")
            cpu, t0 = time.process_time(), time.perf_counter()
            n = await _send_asyncio(writer, size, seconds)
            return {"messages": n, "cpu_s": time.process_time() - cpu, "wall_s": time.perf_counter() - t0}

        return asyncio.run(main())
    raw = socket.create_connection(("127.0.0.1", port))
    conn = _contexts(certs, "client").wrap_socket(raw, server_hostname="127.0.0.1") if mode == "ssl" else raw
    if mode == "ssl":
        conn.sendall(b"")  # the handshake, outside the measured time
    cpu, t0 = time.process_time(), time.perf_counter()
    n = _send_blocking(conn, size, seconds)
    conn.close()
    return {"messages": n, "cpu_s": time.process_time() - cpu, "wall_s": time.perf_counter() - t0}


def one(mode: str, certs: Path, size: int, seconds: float) -> dict[str, float]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, __file__, "--serve", mode, str(port), "--certs", str(certs),
                             "--size", str(size)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    if proc.stdout.readline().strip() != "READY":
        raise RuntimeError("receiver did not start")
    sent = send(mode, port, certs, size, seconds)
    got = json.loads(proc.stdout.readline())
    proc.wait(timeout=30)
    n = sent["messages"]
    return {"messages_s": n / sent["wall_s"], "mb_s": n * size / sent["wall_s"] / 1e6,
            "send_us": 1e6 * sent["cpu_s"] / n, "recv_us": 1e6 * got["cpu_s"] / max(1, got["messages"])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=int, default=512_000, help="bytes a message (default: rule 2's q rows)")
    parser.add_argument("--seconds", type=float, default=1.5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    parser.add_argument("--serve", nargs=2, metavar=("MODE", "PORT"), help=argparse.SUPPRESS)
    parser.add_argument("--certs", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve[0], int(args.serve[1]), Path(args.certs), args.size)
        return
    with tempfile.TemporaryDirectory() as tmp:
        certs = Path(tmp)
        make_certs(certs)
        print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs; {args.size} B messages")
        runs: dict[str, list[dict[str, float]]] = {m: [] for m in args.modes}
        for _ in range(args.repeats):
            for mode in args.modes:
                runs[mode].append(one(mode, certs, args.size, args.seconds))
        for mode, rs in runs.items():
            mb = [r["mb_s"] for r in rs]
            cpu = [r["send_us"] + r["recv_us"] for r in rs]
            floor = [2e6 / (2 * c) for c in cpu]
            print(f"{mode:8s} {min(mb):7.0f}-{max(mb):7.0f} MB/s one way; CPU us per message: send "
                  f"{statistics.median(r['send_us'] for r in rs):6.0f}, receive "
                  f"{statistics.median(r['recv_us'] for r in rs):6.0f} (sum {min(cpu):.0f}-{max(cpu):.0f}); "
                  f"rule-2 floor {min(floor):.0f}-{max(floor):.0f} rounds/s on 2 cores")
        print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
