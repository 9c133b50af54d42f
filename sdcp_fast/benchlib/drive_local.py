"""Runs a workload through the roles in one process (``sdcp_fast.deploy.local``): the
configurations that only differ in what a deployment is started with (drafter, M, batching)
and the in-process peer of a networked run.

Where the time goes: every role runs on one event loop here and the in-process transport is
a direct call, so the parts of a round are serial and add up. The harness times them from
outside the roles: the target's scoring passes and the drafter's proposals through proxies,
the store's object writes and reads and its commit-log appends through a store that times
them (each as long as the round awaited it), and the verifier's acceptance step by wrapping
the function the verifier's batcher calls, for the duration of the run.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from sdcp_fast.benchlib.samples import Config, RoundSample, RunSample, SessionSample
from sdcp_fast.benchlib.workload import Workload
from sdcp_fast.cache.index import Head
from sdcp_fast.commitlog.backend import LogView
from sdcp_fast.protocol.commitlog import LogRecord
from sdcp_fast.store.interface import Log, LogAppend, Store

PHASES = ("draft", "mlc_write", "mlc_read", "scoring", "acceptance", "commit")


class _Clock:
    def __init__(self, run: RunSample) -> None:
        self.run = run

    def add(self, phase: str, seconds: float) -> None:
        self.run.phases[phase] = self.run.phases.get(phase, 0.0) + seconds


def _timed(fn: Callable[..., Any], clock: _Clock, phase: str, after: Callable[[Any, Any, float], None] | None = None
           ) -> Callable[..., Any]:
    def call(*a: Any, **kw: Any) -> Any:
        t = time.perf_counter()
        out = fn(*a, **kw)
        dt = time.perf_counter() - t
        clock.add(phase, dt)
        if after is not None:
            after(a, out, dt)
        return out
    return call


class _Proxy:
    """Delegates everything to ``inner`` except the methods set on it."""

    def __init__(self, inner: Any) -> None:
        self.__dict__["_inner"] = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["_inner"], name)


def timed_scorer(scorer: Any, clock: _Clock) -> Any:
    proxy = _Proxy(scorer)
    proxy.__dict__["score"] = _timed(scorer.score, clock, "scoring",
                                     lambda a, _out, dt: clock.run.passes.append((len(a[0]), dt)))
    return proxy


def timed_drafter(drafter: Any, clock: _Clock) -> Any:
    def count(_a: Any, out: Any, _dt: float) -> None:
        clock.run.drafted_tokens += len(getattr(out, "tokens", ()) or ())

    proxy = _Proxy(drafter)
    proxy.__dict__["propose"] = _timed(drafter.propose, clock, "draft", count)
    return proxy


class _TimedLog:
    def __init__(self, log: Log, clock: _Clock) -> None:
        self.log, self.ref, self.clock = log, log.ref, clock

    async def read(self, start: int = 0) -> LogView:
        return await self.log.read(start)

    async def append(self, record: LogRecord, if_match: str | None) -> str:
        t = time.perf_counter()
        try:
            return await self.log.append(record, if_match)
        finally:
            self.clock.add("commit", time.perf_counter() - t)


class TimedStore:
    """A :class:`~sdcp_fast.store.interface.Store` that adds the time each object write,
    object read and commit-log append of ``store`` took to the run's phases."""

    def __init__(self, store: Store, clock: _Clock) -> None:
        self.store, self.clock = store, clock

    async def put(self, uri: str, data: Any, lease_ttl: float | None = None) -> str | None:
        t = time.perf_counter()
        try:
            return await self.store.put(uri, data, lease_ttl)
        finally:
            self.clock.add("mlc_write", time.perf_counter() - t)

    async def get(self, uri: str) -> memoryview:
        t = time.perf_counter()
        try:
            return await self.store.get(uri)
        finally:
            self.clock.add("mlc_read", time.perf_counter() - t)

    async def head(self, uri: str) -> Head:
        return await self.store.head(uri)

    async def delete(self, uri: str) -> None:
        await self.store.delete(uri)

    async def release(self, lease: str, *, drop: bool = False) -> None:
        await self.store.release(lease, drop=drop)

    async def commit_log(self, ref: str) -> Log:
        return _TimedLog(await self.store.commit_log(ref), self.clock)

    async def append_batch(self, entries: Sequence[LogAppend]) -> list[str | Exception]:
        # The store's own logs, so that its group commit sees them; one pass's appends
        # are awaited together, and count once.
        inner = [e._replace(log=e.log.log) if isinstance(e.log, _TimedLog) else e for e in entries]
        t = time.perf_counter()
        try:
            return await self.store.append_batch(inner)
        finally:
            self.clock.add("commit", time.perf_counter() - t)

    async def aclose(self) -> None:
        await self.store.aclose()


@contextlib.contextmanager
def timed_verifier_steps(clock: _Clock) -> Iterator[None]:
    from sdcp_fast.roles import verifier_batch

    saved = verifier_batch.verify_batch
    verifier_batch.verify_batch = _timed(saved, clock, "acceptance")  # type: ignore[assignment]
    try:
        yield
    finally:
        verifier_batch.verify_batch = saved  # type: ignore[assignment]


def run_inprocess(target: Any, drafter: tuple[Any, bytes] | None, config: Config, workload: Workload,
                  level: int, repeats: int, *, warmup: bool = True, backend: str = "auto",
                  on_session: Callable[[], None] | None = None, timeout: float = 600.0) -> list[RunSample]:
    """``repeats`` measured runs of ``workload`` at ``level`` sessions in flight, on one
    in-process deployment of ``config`` (after one warm-up session, not measured)."""
    from sdcp_fast.store import embedded

    with tempfile.TemporaryDirectory(prefix="sdcp-bench-") as root:
        store = embedded(root)
        try:
            return asyncio.run(asyncio.wait_for(
                _deployment(target, drafter, config, workload, level, repeats, store, warmup, backend, on_session),
                timeout))
        finally:
            store.close()


async def _deployment(target: Any, drafter: tuple[Any, bytes] | None, config: Config, workload: Workload,
                      level: int, repeats: int, store: Any, warmup: bool, backend: str,
                      on_session: Callable[[], None] | None) -> list[RunSample]:
    from sdcp_fast.deploy.local import Engine, spec_for

    run = RunSample(config.name, level, -1)  # the warm-up's, replaced per repeat
    clock = _Clock(run)
    drafters = [] if drafter is None else [timed_drafter(drafter[0], clock)]
    digests = {} if drafter is None else {drafter[0].name: drafter[1]}
    engine = Engine(timed_scorer(target.scorer, clock), drafters, TimedStore(store, clock),
                    target_digest=target.digest, tokenizer_digest=target.tokenizer_digest,
                    drafter_digests=digests, backend=backend, seed=workload.seed,
                    fixed_m=config.m, adaptive_m=config.m is None)
    index_of: dict[bytes, int] = {}
    t0 = [time.perf_counter()]

    def observe(info: Any) -> None:
        i = index_of.get(info.session)
        if i is None:
            return
        action = getattr(info.action, "name", str(info.action)).lower()
        clock.run.rounds.append(RoundSample(time.perf_counter() - t0[0], i, info.drafter, info.proposed,
                                            info.accepted, len(info.emitted), action, info.m_cap, info.batch))

    deployment = engine.deployment(observe)
    # Cross-session batching off is a verifier that scores one session per pass. Its load
    # stays relative to the usual capacity: measured against one session per pass it would
    # always be full, and §6.5.2 would refuse every self-decoding period (the ladder's next
    # step fails the session), so escalation would differ from the batched configuration.
    batcher = deployment.verifier.batcher
    deployment.verifier.load.max_batch = max(batcher.max_batch, config.max_batch)
    batcher.max_batch = config.max_batch

    prompts = [target.prompt(p.text) for p in workload.prompts]

    def spec(i: int, max_new: int) -> Any:
        from sdcp_fast.deploy.local import session_id_for
        from sdcp_fast.protocol import Sampling

        s = workload.sampling(i)
        sampling = None if s is None else Sampling(
            temperature_milli=round(s[0] * 1000), top_p_milli=None if s[1] is None else round(s[1] * 1000),
            top_k=s[2], seed=s[3])
        from dataclasses import replace

        base = spec_for(prompts[i], max_new=max_new, rule=workload.rule, sampling=sampling, stop=target.stop,
                        m=config.m)
        return replace(base, session=session_id_for(workload.seed * 1000 + clock.run.repeat + 1, i))

    async def one(i: int, sample: SessionSample, max_new: int) -> None:
        routed = await deployment.router.open(spec(i, max_new))
        index_of[routed.session] = i
        try:
            async for out in deployment.router.output(routed.session):
                if out.tokens:
                    now = time.perf_counter() - t0[0]
                    if sample.first is None:
                        sample.first = now
                    sample.chunks.append((now, len(out.tokens)))
                    sample.tokens += len(out.tokens)
                    sample.output = [*(sample.output or []), *out.tokens]  # type: ignore[misc]
                if out.final:
                    sample.finish = getattr(out.finish, "name", str(out.finish)).lower()
        except Exception as exc:  # a failed session is a sample too
            sample.problems.append(type(exc).__name__ + ": " + str(exc)[:200])
        sample.finished = time.perf_counter() - t0[0]

    async def measure(run: RunSample) -> None:
        clock.run = run
        index_of.clear()
        n = len(workload.prompts)
        offsets = workload.arrivals(n)
        gate = asyncio.Semaphore(level)
        t0[0] = time.perf_counter()

        async def session(i: int) -> None:
            delay = offsets[i] - (time.perf_counter() - t0[0])
            if delay > 0:
                await asyncio.sleep(delay)
            arrived = time.perf_counter() - t0[0]
            async with gate:
                opened = time.perf_counter() - t0[0]
                # Closed loop, a session arrives when a slot frees; open loop, when it was drawn,
                # so that its TTFT includes the queueing.
                sample = SessionSample(i, workload.prompts[i].kind, arrived if workload.rate else opened, opened)
                run.samples.append(sample)
                await one(i, sample, workload.max_new)
            if on_session is not None:
                on_session()

        await asyncio.gather(*(session(i) for i in range(n)))
        run.wall = time.perf_counter() - t0[0]
        run.samples.sort(key=lambda s: s.index)
        for r in run.rounds:
            s = run.samples[r.session]
            s.rounds += 1
            s.proposed += r.proposed
            s.accepted += r.accepted
        for role in deployment.drafters.values():
            for problems in role.problems.values():
                for p in problems if isinstance(problems, list | tuple) else [problems]:
                    run.problems[str(p)] = run.problems.get(str(p), 0) + 1

    out = []
    with timed_verifier_steps(clock):
        async with deployment:
            if warmup:
                # First passes pay for allocation and kernel selection: not measured.
                await one(0, SessionSample(0, "warmup", 0.0, 0.0), min(8, workload.max_new))
            for k in range(repeats):
                run = RunSample(config.name, level, k)
                await measure(run)
                out.append(run)
    return out
