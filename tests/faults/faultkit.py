"""What the fault scenarios share: a deployment of real processes (``sdcp-fast up``'s, with the
drafters' M fixed and the router's scope known), a front-end client that streams completions
over HTTP/2 + mutual TLS, the uninterrupted reference run of each request (in process), and
the audit of each session's commit log in the MLC.

Nothing is mocked: the processes are the services ``sdcp-fast up`` runs, faults are signals
(``SIGKILL``, ``SIGSTOP``/``SIGCONT``) and restarts, and every check reads what a client or
the commit log saw.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sdcp_fast.cache import object_uri
from sdcp_fast.deploy.up import Up
from sdcp_fast.protocol import Action, Sampling
from sdcp_fast.protocol.commitlog import CommitRecord, FenceRecord
from sdcp_fast.roles.router import serving_spec
from sdcp_fast.roles.sse import DONE, messages
from sdcp_fast.transport.loop import LoopThread

SCOPE = bytes.fromhex("5dc9fa017e57000000000000000000aa")  # fixed, so the test can name each commit log
TEMPERATURE = 0.8  # rule 2's requests


class FaultProxy:
    """A TCP proxy in front of one service (TLS passes through it untouched): it forwards bytes
    both ways and, while ``cut`` or ``delay`` is set, cuts a connection (both directions, at
    once) with probability ``cut`` per chunk forwarded, and holds each chunk up to ``delay``
    seconds, the draws coming from ``seed``. A cut loses every request and response in flight
    on that connection, before or after the peer acted on it: the clients' retries then
    repeat requests the server may already have served."""

    def __init__(self, port: int, target: int, seed: int) -> None:
        self.port, self.target = port, target
        self.rng = random.Random(seed)
        self.cut = 0.0
        self.delay = 0.0
        self.cuts = self.delays = self.connections = 0
        self._runner: LoopThread | None = None
        self._server: asyncio.Server | None = None

    def start(self) -> None:
        self._runner = LoopThread(f"fault-proxy-{self.port}")
        self._server = self._runner.run(asyncio.start_server(self._connection, "127.0.0.1", self.port))

    def stop(self) -> None:
        if self._runner is not None:
            if self._server is not None:
                self._runner.loop.call_soon_threadsafe(self._server.close)
            self._runner.stop()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target)
        except OSError:
            writer.transport.abort()
            return
        writers = (writer, up_writer)

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while chunk := await src.read(65536):
                    if self.cut and self.rng.random() < self.cut:
                        self.cuts += 1
                        for w in writers:
                            w.transport.abort()
                        return
                    if self.delay:
                        self.delays += 1
                        await asyncio.sleep(self.rng.uniform(0, self.delay))
                    dst.write(chunk)
                    await dst.drain()
            except (OSError, ConnectionError):
                pass
            finally:
                for w in writers:
                    w.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))


@dataclass
class FaultUp(Up):
    """``Up`` with the drafters' M fixed (``--m``), the router's scope fixed (``--scope``) and
    each verifier behind a :class:`FaultProxy` (its base URI is the proxy's, it listens
    elsewhere): a seeded rule-2 session then repeats token for token whichever drafter of
    the same model serves it, the commit logs have known names, and the verifiers' traffic
    (proposals, verdicts, output, sessions, assignments) can be cut and delayed."""

    m: int = 1
    scope: bytes = SCOPE
    seed: int = 0
    proxies: dict[str, FaultProxy] = field(default_factory=dict)

    def plan(self) -> None:
        from sdcp_fast.deploy.up import free_port

        super().plan()
        for svc in self.services.values():
            if svc.role == "drafter":
                svc.argv += ["--m", str(self.m)]
            elif svc.role == "router":
                svc.argv += ["--scope", self.scope.hex()]
            elif svc.role == "verifier":
                real = free_port()
                old = svc.uri
                svc.argv += ["--listen", f"127.0.0.1:{real}"]
                svc.port = free_port()
                svc.argv[svc.argv.index(old)] = svc.uri
                self.proxies[svc.name] = FaultProxy(svc.port, real, self.seed + len(self.proxies))
        for proxy in self.proxies.values():
            proxy.start()

    def healthy(self, svc: Any) -> bool:
        """A TLS handshake with the client certificate completes, offering h2 and HTTP/1.1 (the
        MLC server may speak either)."""
        import socket
        import ssl

        certs = self.directory / "certs"
        ctx = ssl.create_default_context(cafile=str(certs / "ca.pem"))
        ctx.load_cert_chain(str(certs / "client.pem"), str(certs / "client.key"))
        ctx.set_alpn_protocols(["h2", "http/1.1"])
        try:
            with socket.create_connection(("127.0.0.1", svc.port), timeout=1) as raw, \
                    ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
                return tls.selected_alpn_protocol() is not None
        except OSError:
            return False

    def faults(self, *, cut: float = 0.0, delay: float = 0.0) -> None:
        """Cut and delay the verifiers' connections at these rates (zero: pass everything)."""
        for proxy in self.proxies.values():
            proxy.cut, proxy.delay = cut, delay

    def stop(self, timeout: float = 10.0) -> None:
        super().stop(timeout)
        for proxy in self.proxies.values():
            proxy.stop()

    def start(self, timeout: float = 180.0) -> None:
        try:
            super().start(timeout)
            self.wait_serving(timeout)
        except BaseException:
            self.stop()
            raise

    def wait_serving(self, timeout: float = 60.0) -> None:
        """Until the front end completes a request: the verifiers and drafters have reported
        their status to the router (answering TLS comes before that)."""
        import subprocess

        e = self.endpoints()
        body = json.dumps({"model": self.model, "prompt": "the", "max_tokens": 1})
        deadline = time.monotonic() + timeout
        while True:
            out = subprocess.run(
                ["curl", "-sS", "--http2", "--cacert", e["ca"], "--cert", e["client_cert"], "--key",
                 e["client_key"], "-H", "content-type: application/json", "-d", body, e["frontend_mtls"] + "completions"],
                capture_output=True, text=True, timeout=30)
            if '"choices"' in out.stdout:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"the front end serves nothing: {out.stdout or out.stderr}")
            time.sleep(0.3)

    def process(self, name: str) -> Any:
        process = self.services[name].process
        assert process is not None
        return process

    def signal(self, name: str, sig: int) -> None:
        os.kill(self.process(name).pid, sig)

    def kill(self, name: str) -> None:
        self.signal(name, signal.SIGKILL)
        self.process(name).wait(10)

    def restart(self, timeout: float = 60.0) -> list[str]:
        """Restart every process that died and wait until each answers."""
        names = self.supervise_once()
        if names:
            self.wait_healthy(names, timeout)
        return names

    def mlc_url(self) -> str:
        return self.services["mlc"].uri

    def role_cert(self, name: str) -> tuple[str, str, str]:
        certs = self.directory / "certs"
        return str(certs / f"{name}.pem"), str(certs / f"{name}.key"), str(certs / "ca.pem")


# -- requests and their uninterrupted runs -------------------------------------------------


@dataclass(frozen=True)
class Job:
    """One completion request; rule 2 when ``seed`` is set (seeded, so it repeats); ``model``
    is the name the front end serves (the deployment's target)."""

    prompt: str
    max_tokens: int
    session: bytes
    seed: int | None = None
    model: str = "toy"

    def body(self, stream: bool = True) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.model, "prompt": self.prompt, "max_tokens": self.max_tokens,
                                "stream": stream, "sdcp_session": self.session.hex()}
        if self.seed is not None:
            body.update(temperature=TEMPERATURE, seed=self.seed)
        return body


PROMPTS = ("the verifier commits", "every session is", "a drafter proposes", "the router verifies",
           "one token and then", "the cache accepts many", "each round of", "the epoch chain")


def _job(rng: random.Random, max_tokens: int, rule2: bool) -> Job:
    return Job(rng.choice(PROMPTS), max_tokens, rng.randbytes(16), rng.randrange(1 << 32) if rule2 else None)


def jobs(rng: random.Random, n: int, max_tokens: int, *, rule2_every: int = 2) -> list[Job]:
    """``n`` requests from ``rng``: every ``rule2_every``-th one seeded rule 2, the rest rule 1."""
    return [_job(rng, max_tokens, bool(rule2_every) and i % rule2_every == 1) for i in range(n)]


def reference_runs(batch: Sequence[Job], m: int, *, target: str = "toy", drafter: str = "toy-good") -> list[Any]:
    """Each job's uninterrupted run, in process, through the same roles with the same drafter,
    M, session id and sampling (the engine's results: tokens, finish, rounds self-decoded);
    ``target`` and ``drafter`` are the deployment's (``load_target``/``load_drafter`` specs)."""
    from sdcp_fast.deploy.catalog import load_drafter, load_target
    from sdcp_fast.deploy.local import Engine
    from sdcp_fast.store import embedded

    model = load_target(target)
    draft, digest = load_drafter(drafter, model)
    # The front end's contract (serving_spec), as the deployment's sessions have.
    specs = [serving_spec(model.encode(j.prompt), max_new=j.max_tokens, stop=model.stop,
                          session=j.session, rule=1 if j.seed is None else 2,
                          sampling=None if j.seed is None else Sampling(temperature_milli=round(TEMPERATURE * 1000),
                                                                       seed=j.seed))
             for j in batch]
    with embedded() as store:
        engine = Engine(model.scorer, [draft], store, target_digest=model.digest,
                        tokenizer_digest=model.tokenizer_digest, drafter_digests={draft.name: digest},
                        fixed_m=m, adaptive_m=False)
        return list(engine.run(specs))


def reference(batch: Sequence[Job], m: int, **models: str) -> list[list[int]]:
    """Each job's tokens in its uninterrupted run: what no fault may change (§6.9); ``models``:
    :func:`reference_runs`'s ``target`` and ``drafter``."""
    return [r.tokens for r in reference_runs(batch, m, **models)]


def steady_jobs(rng: random.Random, n: int, max_tokens: int, m: int, *,
                rule2_every: int = 2) -> tuple[list[Job], list[list[int]]]:
    """Like :func:`jobs`, with their uninterrupted runs, keeping only requests whose run ends
    normally without reaching ``self_decode`` on the escalation ladder: the ladder's counters
    belong to a verifier and start afresh after a fail-over or a reassignment (§6.5), so a
    session that escalates that far may take another path once a fault lands, and a seeded
    rule-2 one other draws (before the front end's contract became ``serving_spec``, seed 4
    also drew a rule-2 request whose uninterrupted run ended in ``fail``). A request that does
    is drawn again, of the same kind."""
    batch = jobs(rng, n, max_tokens, rule2_every=rule2_every)
    runs = reference_runs(batch, m)
    for _ in range(20):
        bad = [i for i, r in enumerate(runs) if r.self_decoded or r.finish is not Action.FINISH]
        if not bad:
            return batch, [r.tokens for r in runs]
        for i in bad:
            batch[i] = _job(rng, max_tokens, batch[i].seed is not None)
        for i, r in zip(bad, reference_runs([batch[i] for i in bad], m), strict=True):
            runs[i] = r
    raise AssertionError("no steady requests drawn in 20 tries")


def words(tokens: Sequence[int], decode: Callable[[Sequence[int]], str] | None = None) -> list[str]:
    """The words of ``tokens``' text, as ``decode`` (default: the toy model's) writes it."""
    if decode is None:
        from sdcp_fast.model.toy import decode as toy_decode

        return toy_decode(list(tokens)).split()
    return decode(tokens).split()


# -- the front end's client ----------------------------------------------------------------


@dataclass
class Seen:
    """What one client saw of its stream."""

    job: Job
    pieces: list[str] = field(default_factory=list)
    finish: str | None = None
    error: str | None = None
    first_at: float | None = None  # seconds from the request to the first piece
    done: bool = False

    @property
    def words(self) -> list[str]:
        return "".join(self.pieces).split()


class Client:
    """Streams completions from the router's front end over HTTP/2 with the client certificate."""

    def __init__(self, up: Up) -> None:
        from sdcp_fast.transport.h2client import H2Transport
        from sdcp_fast.transport.tls import client_context

        certs = up.directory / "certs"
        self.base = up.services["router"].uri
        self.transport = H2Transport(client_context(str(certs / "client.pem"), str(certs / "client.key"),
                                                    str(certs / "ca.pem")), timeout=120.0)

    async def stream(self, seen: Seen, progress: asyncio.Event | None = None) -> Seen:
        t0 = time.monotonic()
        try:
            response = await self.transport.request_stream(
                self.base, "POST", "v1/completions", body=json.dumps(seen.job.body()).encode(),
                headers={"content-type": "application/json"}, timeout=60.0)
            if response.status != 200:
                body = response.body
                if response.stream is not None:
                    body = b"".join([chunk async for chunk in response.stream])
                seen.error = f"HTTP {response.status}: {body[:300]!r}"
                return seen
            assert response.stream is not None
            async for message in messages(response.stream):
                if message == DONE:
                    seen.done = True
                    continue
                if "error" in message:
                    seen.error = json.dumps(message["error"])
                    continue
                choice = message["choices"][0]
                if choice["text"]:
                    seen.first_at = seen.first_at if seen.first_at is not None else time.monotonic() - t0
                    seen.pieces.append(choice["text"])
                    if progress is not None:
                        progress.set()
                seen.finish = choice.get("finish_reason") or seen.finish
        except Exception as exc:  # noqa: BLE001 - recorded, the test asserts on it
            seen.error = f"{type(exc).__name__}: {exc}"
        return seen

    async def close(self) -> None:
        await self.transport.close()


# -- the commit log's audit ----------------------------------------------------------------


@dataclass
class Audit:
    records: int
    rounds: list[int]
    epochs: list[int]
    fences: list[int]
    tokens: list[int]


def read_log(up: FaultUp, session: bytes) -> list[Any]:
    """The session's commit log in the MLC, read with the router's certificate."""
    from sdcp_fast.commitlog.http import HttpCommitLog
    from sdcp_fast.transport.tls import client_context

    cert, key, ca = up.role_cert("router")
    log = HttpCommitLog.on_server(up.mlc_url(), object_uri(up.scope, session, "commit_log"),
                                  ssl=client_context(cert, key, ca))
    try:
        return list(log.read().records)
    finally:
        log.close()


def audit(up: FaultUp, session: bytes) -> Audit:
    """The log's invariants (§6.8): each round once and in order, each commit extending the
    last, epochs never going down, each fence above every epoch before it."""
    rounds, epochs, fences, tokens = [], [], [], []
    epoch = 0
    records = read_log(up, session)
    for record in records:
        if isinstance(record, FenceRecord):
            assert record.epoch > epoch, f"fence {record.epoch} after epoch {epoch}"
            fences.append(record.epoch)
            epoch = record.epoch
            continue
        assert isinstance(record, CommitRecord)
        assert record.epoch >= epoch, f"a commit of epoch {record.epoch} after epoch {epoch}"
        assert record.round == len(rounds) + 1, f"round {record.round} after {len(rounds)} rounds"
        assert record.committed == len(tokens) + len(record.emitted), "a commit that does not extend the last"
        epoch = record.epoch
        rounds.append(record.round)
        epochs.append(record.epoch)
        tokens.extend(record.emitted)
    return Audit(len(records), rounds, epochs, fences, tokens)


def metric(up: Up, name: str, metric_name: str) -> float:
    """A counter of a role's GET metrics (0 when absent or unreachable)."""
    import subprocess

    e = up.endpoints()
    out = subprocess.run(["curl", "-sS", "--http2", "--cacert", e["ca"], "--cert", e["client_cert"], "--key",
                          e["client_key"], up.services[name].uri + "metrics"],
                         capture_output=True, text=True, timeout=10)
    total = 0.0
    for line in out.stdout.splitlines():
        if line.startswith(metric_name) and not line.startswith("#"):
            total += float(line.split()[-1])
    return total


def proc_stats(pid: int) -> tuple[int, int]:
    """(resident set in KiB, open file descriptors) of a process, from /proc."""
    rss = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1])
    return rss, len(os.listdir(f"/proc/{pid}/fd"))


# -- running a batch under faults ----------------------------------------------------------

Faults = Callable[[asyncio.Event], Awaitable[None]]


def run_batch(up: FaultUp, batch: Sequence[Job], faults: Faults | None = None, timeout: float = 150.0) -> list[Seen]:
    """Stream every job at once; ``faults`` runs beside them from the first piece streamed."""

    async def main() -> list[Seen]:
        client = Client(up)
        progress = asyncio.Event()
        try:
            streams = asyncio.gather(*(client.stream(Seen(job), progress) for job in batch))
            injector = None
            if faults is not None:
                async def inject() -> None:
                    await progress.wait()
                    await faults(progress)
                injector = asyncio.create_task(inject())
            seen = await asyncio.wait_for(streams, timeout)
            if injector is not None:
                await asyncio.wait_for(injector, timeout)
            return list(seen)
        finally:
            await client.close()

    return asyncio.run(main())


def check_batch(up: FaultUp, seen: Sequence[Seen], expected: Sequence[Sequence[int]], *,
                rule2_exact: bool = False, decode: Callable[[Sequence[int]], str] | None = None) -> list[Audit]:
    """Every session completed, streamed each token of its commit log once and in order (no
    piece repeated or missing), and its log keeps the audit's invariants (each round once).
    Rule-1 sessions must equal their uninterrupted run token for token; seeded rule-2 ones too
    only with ``rule2_exact`` (docs/reliability.md, "Rule 2 and the shape of rounds": the
    drafter service drafts the next round ahead, and a new drafter or assignment drafts it
    afresh, so a fault changes the proposals, and with them the draws, of later rounds).
    ``decode`` writes a log's tokens as the front end does (default: the toy model's words)."""
    audits = []
    for s, tokens in zip(seen, expected, strict=True):
        name = f"session {s.job.session.hex()[:8]} (rule {1 if s.job.seed is None else 2})"
        a = audit(up, s.job.session)
        exact = s.job.seed is None or rule2_exact
        if not exact and s.error is not None and "sdcp-session-failed" in s.error:
            # Its draws changed, and with them its acceptance: the escalation ladder may end in
            # fail (§6.5), a verdict of the protocol like any other. What was streamed is still
            # its log's tokens, once each.
            assert s.words == words(a.tokens, decode), f"{name}: the stream is not its log's tokens once each"
            audits.append(a)
            continue
        assert s.error is None and s.done, f"{name}: {s.error}"
        assert s.finish == "length", name
        assert len(a.tokens) == s.job.max_tokens, name
        assert s.words == words(a.tokens, decode), f"{name}: the stream is not its log's tokens once each"
        if exact:
            at = next((i for i, (x, y) in enumerate(zip(a.tokens, tokens, strict=False)) if x != y), None)
            assert a.tokens == list(tokens), f"{name}: log differs from the uninterrupted run at {at}; fences {a.fences}"
        audits.append(a)
    return audits


async def busiest(up: FaultUp, role: str, counter: str, window: float = 0.5, deadline: float = 30.0) -> str:
    """The process of ``role`` whose ``counter`` grew most over ``window`` seconds: the one
    serving sessions now (counters are cumulative, and a restarted process starts from 0).
    On a loaded machine a window can pass with no growth anywhere: then it looks again (up to
    ``deadline`` seconds), rather than name a process that may serve nothing."""

    async def counts() -> dict[str, float]:
        return {name: await asyncio.to_thread(metric, up, name, counter)
                for name, svc in up.services.items() if svc.role == role}

    t0 = time.monotonic()
    before = await counts()
    while True:
        await asyncio.sleep(window)
        after = await counts()
        growth = {n: after[n] - before.get(n, 0.0) for n in after}
        if max(growth.values()) > 0 or time.monotonic() - t0 > deadline:
            return max(growth, key=lambda n: growth[n])


async def busiest_verifier(up: FaultUp, window: float = 0.5) -> str:
    """The verifier committing the most rounds now (the one whose death hurts most)."""
    return await busiest(up, "verifier", "sdcp_rounds_total", window)


async def holding(up: FaultUp, sessions: Sequence[bytes]) -> dict[str, list[bytes]]:
    """Per verifier (its service name), those of ``sessions`` the router's routing records give
    it that have not ended: where a kill now lands on these sessions mid-stream."""
    from sdcp_fast.cache.http_client import AsyncMLC, mlc_transport
    from sdcp_fast.protocol import SdcpProblem
    from sdcp_fast.protocol.routing_records import decode_record
    from sdcp_fast.transport.tls import client_context

    names = {svc.uri.rstrip("/"): name for name, svc in up.services.items() if svc.role == "verifier"}
    held: dict[str, list[bytes]] = {name: [] for name in names.values()}
    transport = mlc_transport(client_context(*up.role_cert("router")))
    mlc = AsyncMLC(up.mlc_url(), transport)
    try:
        for session in sessions:
            try:
                routed = decode_record(bytes(await mlc.get(object_uri(up.scope, session, "routing"))))
            except SdcpProblem:
                continue  # not routed yet
            name = names.get(routed.verifier.rstrip("/"))
            if name is not None and not routed.done:
                held[name].append(session)
    finally:
        await transport.close()
    return held


async def holder(up: FaultUp, sessions: Callable[[], Sequence[bytes]] | Sequence[bytes],
                 deadline: float = 60.0) -> tuple[str, list[bytes]]:
    """The verifier that holds most of ``sessions`` (or of what ``sessions()`` gives each time
    it looks) not yet ended, and those it holds, once one holds any (or at the deadline: then
    none)."""
    t0 = time.monotonic()
    while True:
        held = await holding(up, sessions() if callable(sessions) else sessions)
        name = max(held, key=lambda n: len(held[n]))
        if held[name] or time.monotonic() - t0 > deadline:
            return name, held[name]
        await asyncio.sleep(0.05)


async def failovers(up: FaultUp) -> float:
    """The router's fail-overs so far (§6.9: each appended its fence before it counted)."""
    return await asyncio.to_thread(metric, up, "router", "sdcp_failovers_total")


async def fenced(up: FaultUp, sessions: Sequence[bytes]) -> bool:
    """Whether the commit log of one of ``sessions`` holds a fence (§6.9: a fail-over's first step)."""
    for session in sessions:
        if any(isinstance(r, FenceRecord) for r in await asyncio.to_thread(read_log, up, session)):
            return True
    return False


async def stop_until_failed_over(up: FaultUp, name: str, *, least: float, deadline: float = 90.0,
                                 sessions: Sequence[bytes] | None = None) -> bool:
    """Partition ``name`` (SIGSTOP) for at least ``least`` seconds and until the router has
    failed a session over (the log of one of ``sessions`` holds a fence; without them, the
    router's fail-over counter grew), then continue it (SIGCONT), however slowly a loaded
    machine lets the router get there; whether a fail-over came within ``deadline`` seconds."""
    before = await failovers(up)
    up.signal(name, signal.SIGSTOP)
    t0 = time.monotonic()
    try:
        await asyncio.sleep(least)
        while True:
            moved = await fenced(up, sessions) if sessions else await failovers(up) > before
            if moved or time.monotonic() - t0 >= deadline:
                return moved
            await asyncio.sleep(0.25)
    finally:
        up.signal(name, signal.SIGCONT)
