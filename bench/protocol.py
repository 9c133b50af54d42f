"""The verifier role over HTTP/2 + mutual TLS with a trivial scorer, next to a bare echo
server on the same transport, measured in the same run; and the core's CPU cost per round.

What is measured: a child process serves a :class:`~sdcp_fast.roles.verifier.VerifierRole`
whose scorer returns constant logits (V = 32, so scoring costs next to nothing) and whose
commit log is in memory (the file log's fsync would measure the disk); this process opens
one session per worker as the router, then each worker proposes rounds of M = 4 tokens as
the assigned drafter, each as soon as the last verdict came back. Reported: rounds/s, p50
and p99 verdict latency, the verifier's CPU microseconds per round, and the same for the echo
server of ``bench/transport.py`` at the same concurrency (goal: >= 80% of the echo's rate).
Then the core alone (``VerifierSession``: receive, complete, append_done) in a loop (goal:
< 50 us per round).

    python bench/protocol.py                 # ~30 s: concurrency 1, 16, 64
    python bench/protocol.py --seconds 5 --concurrency 8 --json out.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))

from transport import echo_server, make_certs, measure  # noqa: E402

from sdcp_fast.cache import object_uri  # noqa: E402
from sdcp_fast.commitlog.base import LogView, PreconditionFailed, etag_of, fence_error, length_of  # noqa: E402
from sdcp_fast.protocol import (  # noqa: E402
    Assignment,
    Contract,
    Proposal,
    SessionOpen,
    Status,
    VerifierSession,
)
from sdcp_fast.protocol.commitlog import LogRecord, fence_epoch  # noqa: E402
from sdcp_fast.protocol.peer import PeerRole  # noqa: E402
from sdcp_fast.roles.wire import SdcpClient  # noqa: E402
from sdcp_fast.store import LocalStore, Log, embedded  # noqa: E402
from sdcp_fast.transport.base import Request, Response  # noqa: E402
from sdcp_fast.transport.certs import InstanceSpec, write_certificates  # noqa: E402
from sdcp_fast.transport.h2client import H2Transport  # noqa: E402
from sdcp_fast.transport.loop import run  # noqa: E402
from sdcp_fast.transport.tls import client_context, server_context  # noqa: E402

VOCAB, M = 32, 4
TARGET = bytes(range(32))
VERIFIER, DRAFTER, ROUTER = "https://127.0.0.1:8501/", "https://127.0.0.1:8511/", "https://127.0.0.1:8500/"


class ConstantScorer:
    """Logits that make token 0 the argmax everywhere: every proposal of zeros is accepted."""

    vocab_size = VOCAB

    def score(self, batch: Any) -> list[torch.Tensor]:
        row = torch.zeros(VOCAB)
        row[0] = 1.0
        return [row.expand(len(r.proposal) + 1, VOCAB) for r in batch]

    def release(self, session: bytes) -> None:
        return None


class MemoryLog:
    """A commit log in memory with the file log's semantics (fenced, tags = record counts)."""

    def __init__(self, ref: str) -> None:
        self.ref = ref
        self.records: list[LogRecord] = []

    async def read(self, start: int = 0) -> LogView:
        return LogView(self.records[start:], start, etag_of(len(self.records)))

    async def append(self, record: LogRecord, if_match: str | None) -> str:
        fence = fence_epoch(self.records)
        if record.epoch < fence:
            raise fence_error(fence, record)
        if if_match is not None and length_of(if_match) != len(self.records):
            raise PreconditionFailed("log changed")
        self.records.append(record)
        return etag_of(len(self.records))


class MemoryStore(LocalStore):
    """The embedded store with its commit logs in memory."""

    def __init__(self) -> None:
        store = embedded()
        super().__init__(store.mlc, store.logs)
        self.memory_logs: dict[str, MemoryLog] = {}

    async def commit_log(self, ref: str) -> Log:
        return self.memory_logs.setdefault(ref, MemoryLog(ref))


SESSION_TOKENS = 256  # each session ends after this many tokens and the worker opens another


def contract() -> Contract:
    return Contract(target=TARGET, tokenizer=bytes(32), rule=1, m_max=8, max_new=SESSION_TOKENS, stop=(),
                    low_rounds=2, fallback=(1, 5), scope=bytes(16))


async def _serve(certs: Path) -> None:
    from sdcp_fast.protocol.peer import Peer
    from sdcp_fast.roles.verifier import VerifierRole
    from sdcp_fast.transport.h2server import serve
    from sdcp_fast.transport.inprocess import InProcessNetwork

    role = VerifierRole(ConstantScorer(), uri=VERIFIER, mlc=MemoryStore(),
                        transport=InProcessNetwork().transport(Peer(VERIFIER, PeerRole.VERIFIER)),
                        target_digest=TARGET, backend="reference", batch_wait=0.0)

    async def cpu(request: Request) -> Response:
        return Response(200, repr(time.process_time()).encode())

    role.routes.add("GET", "cpu", cpu)
    ctx = server_context(str(certs / "verifier.pem"), str(certs / "verifier.key"), str(certs / "ca.pem"))
    server = await serve(role.handler, "127.0.0.1", 0, ssl=ctx)
    await role.start()
    print(f"PORT {server.port}", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    server.close()
    await role.close()


def _transport(certs: Path, name: str) -> H2Transport:
    return H2Transport(client_context(str(certs / f"{name}.pem"), str(certs / f"{name}.key"), str(certs / "ca.pem")))


async def _rounds(port: int, certs: Path, concurrency: int, seconds: float) -> dict[str, float]:
    base = f"https://127.0.0.1:{port}/"
    router, drafter = SdcpClient(_transport(certs, "router")), SdcpClient(_transport(certs, "drafter"))
    status = Status(instance=DRAFTER, role=1, load=0, queue=0, ttl_ms=10_000)
    c = contract()

    async def new_session() -> Any:
        sid = torch.randint(0, 256, (16,), dtype=torch.uint8).numpy().tobytes()
        open_ = SessionOpen(session=sid, epoch=1, contract=c, prompt=(1, 2, 3),
                            commit_log=object_uri(bytes(16), sid, "commit_log"))
        state = await router.open_session(base, open_)
        return await router.put_drafter(base, Assignment(
            session=sid, epoch=1, contract=c, verifier=base, drafter=DRAFTER, prompt=(1, 2, 3), round=0,
            committed=0, digest=state.digest, m_init=M))

    async def worker(until: float, latencies: list[float] | None) -> None:
        state = await new_session()
        round_, committed, digest = state.round, state.committed, state.digest
        while (now := time.perf_counter()) < until:
            m = min(M, SESSION_TOKENS - committed - 1)
            if m < 1:  # sessions are as long as real ones: a fresh one when this one is done
                state = await new_session()
                round_, committed, digest = state.round, state.committed, state.digest
                continue
            verdict = await drafter.propose(base, Proposal(
                session=state.session, epoch=1, round=round_ + 1, drafter=DRAFTER, base=committed,
                base_digest=digest, tokens=(0,) * m, status=status))
            round_, committed, digest = verdict.round, verdict.committed, verdict.digest
            if latencies is not None:
                latencies.append(time.perf_counter() - now)

    cpu_client = drafter.transport
    warm = time.perf_counter() + min(1.0, seconds / 3)
    await asyncio.gather(*(worker(warm, None) for _ in range(concurrency)))
    latencies: list[float] = []
    cpu0 = float((await cpu_client.request(base, "GET", "cpu")).body)
    t0 = time.perf_counter()
    await asyncio.gather(*(worker(t0 + seconds, latencies) for _ in range(concurrency)))
    elapsed = time.perf_counter() - t0
    cpu = float((await cpu_client.request(base, "GET", "cpu")).body) - cpu0
    await router.transport.close()
    await cpu_client.close()
    n = len(latencies)
    cuts = statistics.quantiles(latencies, n=100) if n >= 2 else latencies * 99
    return {"concurrency": concurrency, "rounds": n, "rps": n / elapsed, "p50_ms": cuts[49] * 1e3,
            "p99_ms": cuts[98] * 1e3, "server_us_per_req": cpu / n * 1e6}


def core_cost(rounds: int = 20000) -> float:
    """Microseconds of the sans-I/O core per round: receive, complete, append_done (rule 1),
    over sessions of ``SESSION_TOKENS`` tokens (a new one opened when one is done)."""
    c = contract()
    status = Status(instance=DRAFTER, role=1, load=0, queue=0, ttl_ms=10_000)
    log = object_uri(bytes(16), b"s" * 16, "commit_log")
    elapsed, session = 0.0, None
    for _ in range(rounds):
        if session is None or session.committed + M + 1 > SESSION_TOKENS:
            session, state = VerifierSession.open(
                SessionOpen(session=b"s" * 16, epoch=1, contract=c, prompt=(1, 2, 3), commit_log=log),
                target_digest=TARGET, vocab=VOCAB)
            session.assign(Assignment(session=b"s" * 16, epoch=1, contract=c, verifier=VERIFIER, drafter=DRAFTER,
                                      prompt=(1, 2, 3), round=0, committed=0, digest=state.digest, m_init=M))
        proposal = Proposal(session=b"s" * 16, epoch=1, round=session.round + 1, drafter=DRAFTER,
                            base=session.committed, base_digest=session.digest, tokens=(0,) * M, status=status)
        t0 = time.thread_time()  # CPU time: what the core costs, whatever else the machine runs
        session.receive_proposal(proposal, client=DRAFTER, now=0.0)
        session.complete_scoring(M, 0, load=0)
        session.append_done(ok=True)
        elapsed += time.thread_time() - t0
    return elapsed / rounds * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--certs", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        run(_serve(Path(args.certs)))
        return 0
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        certs = Path(tmp)
        make_certs(certs)  # server/client for the echo baseline
        write_certificates(certs, [InstanceSpec("verifier", PeerRole.VERIFIER, VERIFIER),
                                   InstanceSpec("drafter", PeerRole.DRAFTER, DRAFTER),
                                   InstanceSpec("router", PeerRole.ROUTER, ROUTER)])
        child = subprocess.Popen([sys.executable, __file__, "--serve", "--certs", str(certs)],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            assert child.stdout is not None
            port = int(child.stdout.readline().split()[1])
            with echo_server("h2", certs) as echo_port:
                for concurrency in args.concurrency:
                    verifier = run(_rounds(port, certs, concurrency, args.seconds))

                    async def echo_run(c: int = concurrency) -> dict[str, float]:
                        from transport import _client

                        client = _client("h2", certs, c)
                        try:
                            return await measure(client, f"https://127.0.0.1:{echo_port}/", c, args.seconds,
                                                 b"x" * 200)
                        finally:
                            await client.close()

                    echo = run(echo_run())
                    rows.append({"concurrency": concurrency, "verifier": verifier, "echo": echo,
                                 "ratio": verifier["rps"] / echo["rps"]})
                    print(f"concurrency {concurrency:3d}: verifier {verifier['rps']:7.0f} rounds/s "
                          f"(p50 {verifier['p50_ms']:.2f} ms, p99 {verifier['p99_ms']:.2f} ms, "
                          f"{verifier['server_us_per_req']:.0f} us CPU/round)  echo {echo['rps']:7.0f} req/s "
                          f"({echo['server_us_per_req']:.0f} us CPU/req)  ratio {rows[-1]['ratio']:.2f} "
                          f"(goal >= 0.80)", flush=True)
        finally:
            assert child.stdin is not None
            child.stdin.close()
            child.wait(timeout=30)
    core = core_cost()
    print(f"core: {core:.1f} us per round (receive + complete + append_done, rule 1, M={M}; goal < 50)")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "core_us_per_round": core}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
