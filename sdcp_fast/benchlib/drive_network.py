"""Runs a workload against a deployment over the network: sessions through the router's
OpenAI-compatible front end (``POST v1/chat/completions``, streamed), HTTP/2 + mutual TLS
with the client certificate given, and the deployment's own counters (``GET metrics`` of the
verifiers named, read before and after each run) for rounds, acceptance and batching.

What a client cannot see: which tokens a piece of text holds. The harness spreads a
session's token count (the stream's ``usage``) over its pieces by their share of the text,
so inter-token latencies over the network are estimates; TTFT and throughput are not.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sdcp_fast.benchlib.samples import Config, RunSample, SessionSample
from sdcp_fast.benchlib.workload import Workload
from sdcp_fast.roles.sse import DONE, messages


@dataclass
class Remote:
    router: str  # the router's base URI (the front end is under v1/)
    ca: str
    cert: str
    key: str
    metrics: list[str] = field(default_factory=list)  # base URIs whose GET metrics are read (verifiers)
    model: str | None = None  # asked from GET v1/models when None

    def __post_init__(self) -> None:
        self.router = self.router.rstrip("/") + "/"


def parse_metrics(text: str) -> dict[str, float]:
    """Samples of the exposition format by name and labels (``sdcp_*`` only)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("sdcp_") and " " in line:
            name, _, value = line.rpartition(" ")
            try:
                out[name] = out.get(name, 0.0) + float(value)
            except ValueError:
                continue
    return out


def _delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {k: v - before.get(k, 0.0) for k, v in after.items() if v - before.get(k, 0.0)}


class _Client:
    def __init__(self, remote: Remote) -> None:
        from sdcp_fast.transport.h2client import H2Transport
        from sdcp_fast.transport.tls import client_context

        self.remote = remote
        self.h2 = H2Transport(client_context(remote.cert, remote.key, remote.ca))

    async def model(self) -> str:
        if self.remote.model is None:
            r = await self.h2.request(self.remote.router, "GET", "v1/models", timeout=30)
            if r.status != 200:
                raise RuntimeError(f"GET v1/models answered {r.status}: {r.body[:200]!r}")
            self.remote.model = json.loads(r.body)["data"][0]["id"]
        return self.remote.model

    async def counters(self) -> dict[str, float]:
        total: dict[str, float] = {}
        for uri in self.remote.metrics:
            r = await self.h2.request(uri.rstrip("/") + "/", "GET", "metrics", timeout=30)
            for k, v in parse_metrics(r.body.decode()).items():
                total[k] = total.get(k, 0.0) + v
        return total

    async def session(self, body: dict[str, Any], sample: SessionSample, t0: float,
                      timeout: float) -> list[tuple[float, str]]:
        """Streams one completion into ``sample``; the pieces of text with their times."""
        pieces: list[tuple[float, str]] = []
        try:
            r = await self.h2.request_stream(self.remote.router, "POST", "v1/chat/completions",
                                             body=json.dumps(body).encode(),
                                             headers={"content-type": "application/json"}, timeout=timeout)
            if r.status != 200:
                raise RuntimeError(f"front end answered {r.status}: {r.body[:200]!r}")
            assert r.stream is not None
            async for message in messages(r.stream):
                if message == DONE:
                    continue
                if "error" in message:
                    raise RuntimeError(str(message["error"].get("message", message["error"]))[:200])
                if message.get("usage"):
                    sample.tokens = int(message["usage"]["completion_tokens"])
                for choice in message.get("choices", ()):
                    piece = (choice.get("delta") or {}).get("content") or ""
                    if piece:
                        now = time.perf_counter() - t0
                        sample.first = now if sample.first is None else sample.first
                        pieces.append((now, piece))
                    sample.finish = choice.get("finish_reason") or sample.finish
        except Exception as exc:  # a failed session is a sample too
            sample.problems.append(type(exc).__name__ + ": " + str(exc)[:200])
        sample.finished = time.perf_counter() - t0
        chars = sum(len(p) for _, p in pieces) or 1
        sample.chunks = [(t, sample.tokens * len(p) / chars) for t, p in pieces]  # type: ignore[misc]
        sample.output = "".join(p for _, p in pieces)
        return pieces

    async def ready(self, model: str, text: str, within: float) -> None:
        """Waits until the router knows a live verifier (a deployment just started has not
        heard from its verifiers yet)."""
        deadline = time.monotonic() + within
        body = {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": 1}
        while True:
            r = await self.h2.request(self.remote.router, "POST", "v1/chat/completions", body=json.dumps(body).encode(),
                                      headers={"content-type": "application/json"}, timeout=within)
            if r.status == 200:
                return
            if b"no live verifier" not in r.body or time.monotonic() > deadline:
                raise RuntimeError(f"the front end is not ready: {r.status} {r.body[:200]!r}")
            await asyncio.sleep(0.25)

    async def close(self) -> None:
        await self.h2.close()


def served_model(remote: Remote) -> str:
    """The model the deployment's front end serves (``GET v1/models``)."""
    from sdcp_fast.transport.loop import run as run_loop

    async def ask() -> str:
        client = _Client(remote)
        try:
            return await client.model()
        finally:
            await client.close()

    return run_loop(ask())  # type: ignore[no-any-return]


def body_for(model: str, text: str, workload: Workload, index: int, max_new: int) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "messages": [{"role": "user", "content": text}],
                            "max_tokens": max_new, "stream": True, "stream_options": {"include_usage": True}}
    s = workload.sampling(index)
    if s is not None:
        body["temperature"], body["seed"] = s[0], s[3]
        if s[1] is not None:
            body["top_p"] = s[1]
        if s[2] is not None:
            body["top_k"] = s[2]
    return body


def run_remote(remote: Remote, config: Config, workload: Workload, level: int, repeats: int, *,
               warmup: bool = True, on_session: Callable[[], None] | None = None,
               timeout: float = 600.0) -> list[RunSample]:
    from sdcp_fast.transport.loop import run as run_loop

    return run_loop(asyncio.wait_for(_runs(remote, config, workload, level, repeats, warmup, on_session, timeout),
                                     timeout))  # type: ignore[no-any-return]


async def _runs(remote: Remote, config: Config, workload: Workload, level: int, repeats: int, warmup: bool,
                on_session: Callable[[], None] | None, timeout: float) -> list[RunSample]:
    client = _Client(remote)
    out = []
    try:
        model = await client.model()
        await client.ready(model, workload.prompts[0].text, 60.0)
        if warmup:
            await client.session(body_for(model, workload.prompts[0].text, workload, 0, min(8, workload.max_new)),
                                 SessionSample(0, "warmup", 0.0, 0.0), time.perf_counter(), timeout)
        for k in range(repeats):
            run = RunSample(config.name, level, k)
            before = await client.counters()
            pieces = await _measure(client, model, run, workload, level, on_session, timeout)
            run.counters = _delta(await client.counters(), before)
            estimate_missing_tokens(run, pieces)
            lat_sum = run.counters.get("sdcp_verdict_latency_seconds_sum", 0.0)
            if lat_sum:  # proposal received to verdict released, at the verifiers; the rest is outside them
                run.phases["verifier"] = lat_sum
            out.append(run)
    finally:
        await client.close()
    return out


async def _measure(client: _Client, model: str, run: RunSample, workload: Workload, level: int,
                   on_session: Callable[[], None] | None, timeout: float) -> dict[int, list[tuple[float, str]]]:
    n = len(workload.prompts)
    pieces: dict[int, list[tuple[float, str]]] = {}
    offsets = workload.arrivals(n)
    gate = asyncio.Semaphore(level)
    t0 = time.perf_counter()

    async def session(i: int) -> None:
        delay = offsets[i] - (time.perf_counter() - t0)
        if delay > 0:
            await asyncio.sleep(delay)
        arrived = time.perf_counter() - t0
        async with gate:
            opened = time.perf_counter() - t0
            # Closed loop, a session arrives when a slot frees; open loop, when it was drawn,
            # so that its TTFT includes the queueing.
            sample = SessionSample(i, workload.prompts[i].kind, arrived if workload.rate else opened, opened)
            run.samples.append(sample)
            pieces[i] = await client.session(body_for(model, workload.prompts[i].text, workload, i,
                                                      workload.max_new), sample, t0, timeout)
        if on_session is not None:
            on_session()

    await asyncio.gather(*(session(i) for i in range(n)))
    run.wall = time.perf_counter() - t0
    run.samples.sort(key=lambda s: s.index)
    return pieces


def estimate_missing_tokens(run: RunSample, pieces: dict[int, list[tuple[float, str]]]) -> None:
    """A stream that ends in an error sends no ``usage``: such sessions share the tokens the
    verifiers emitted in the run beyond those the others reported, by their share of the text
    (marked ``tokens_estimated``), so that a failed session's output still counts."""
    missing = [s for s in run.samples if not s.tokens and any(p for _, p in pieces.get(s.index, ()))]
    rest = run.counters.get("sdcp_emitted_tokens_total", 0.0) - sum(s.tokens for s in run.samples)
    if not missing or rest <= 0:
        return
    chars = {s.index: sum(len(p) for _, p in pieces[s.index]) for s in missing}
    total = sum(chars.values())
    for s in missing:
        s.tokens = round(rest * chars[s.index] / total)
        s.chunks = [(t, s.tokens * len(p) / chars[s.index]) for t, p in pieces[s.index]]  # type: ignore[misc]
        s.tokens_estimated = True
