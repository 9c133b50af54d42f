"""Scenario 2 of the fault plan across processes (§6.3 "MAY publish the target KV cache", §6.9
``resume.target_kv``; docs/reliability.md, "Scenario 2: fail-over without a cold prefill"):
``sdcp-fast up``'s processes serving the shipped ``tiny-target`` (a paged Llama), the busiest
verifier killed with -9 once its sessions' pages are in the MLC, the standby resuming them from
those pages instead of prefilling prompt and output again. No committed token may change.

Its own deployment: the shared one (conftest's ``up``) serves the toy target, which keeps no KV.
"""

from __future__ import annotations

import asyncio
import random
import re
import shutil
import statistics
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import pytest

from .conftest import STATUS_TTL_MS
from .faultkit import Client, FaultUp, Job, Seen, busiest_verifier, check_batch, metric, reference_runs

pytestmark = pytest.mark.services

TARGET = "tiny-target"
DRAFTER = "ngram"  # both drafters: a reassignment proposes what the first one would have
M = 3
SESSIONS = 3
PROMPT_WORDS = 120  # with the tail about 220 tokens: the prefill a resume from pages saves
MAX_TOKENS = 320  # sessions still running once their first pages are published
# tiny-target learnt dictionary definitions: after random words its greedy continuation mostly
# ends with <|endoftext|> within a few dozen tokens; after a phrase repeated this often it goes
# on repeating it, which the n-gram drafter proposes (so no session needs the verifier to decode
# rounds itself, and the uninterrupted runs rarely need drawing again).
TAIL = ", or the like" * 24 + ", or the"


@pytest.fixture(scope="module")
def kv_up(tmp_path_factory: pytest.TempPathFactory, seed: int) -> Iterator[FaultUp]:
    if shutil.which("curl") is None:
        pytest.skip("curl is not installed (the kit reads metrics with it)")
    deployment = FaultUp(tmp_path_factory.mktemp("kv-faults"), model=TARGET, drafters=(DRAFTER, DRAFTER),
                         status_ttl_ms=STATUS_TTL_MS, seed=seed, m=M)
    try:
        deployment.start(timeout=120)
        yield deployment
    finally:
        deployment.stop()


def _job(rng: random.Random, target: Any) -> Job:
    """A prompt of ``PROMPT_WORDS`` words of the target's own vocabulary, then ``TAIL``."""
    vocab = target.loaded.tokenizer.get_vocab()
    words = sorted(w for w in vocab if w.startswith("Ġ") and w[1:].isalpha() and len(w) > 3)
    text = target.decode([vocab[w] for w in rng.choices(words, k=PROMPT_WORDS)]).strip() + "." + TAIL
    return Job(text, MAX_TOKENS, rng.randbytes(16), model=TARGET)


def steady_long_jobs(rng: random.Random, n: int) -> tuple[list[Job], list[list[int]]]:
    """``n`` rule-1 requests whose uninterrupted run commits ``MAX_TOKENS`` tokens without the
    verifier decoding any round itself (so ending neither at a stop token nor in an escalation
    that hangs on the verifier's load: faultkit's ``steady_jobs``), with their runs' tokens."""
    from sdcp_fast.deploy.catalog import load_target
    from sdcp_fast.protocol import Action

    target = load_target(TARGET)
    batch = [_job(rng, target) for _ in range(n)]
    runs = reference_runs(batch, M, target=TARGET, drafter=DRAFTER)
    for _ in range(10):
        bad = [i for i, r in enumerate(runs)
               if r.self_decoded or r.finish is not Action.FINISH or len(r.tokens) != MAX_TOKENS]
        if not bad:
            for job in batch:
                assert len(target.encode(job.prompt)) >= 200
            return batch, [r.tokens for r in runs]
        for i in bad:
            batch[i] = _job(rng, target)
        for i, r in zip(bad, reference_runs([batch[i] for i in bad], M, target=TARGET, drafter=DRAFTER),
                        strict=True):
            runs[i] = r
    raise AssertionError("no steady requests drawn in 10 tries")


class Stamped(list[str]):
    """A stream's pieces, each with the time it arrived (``time.time``: the services' logs are
    compared with it)."""

    def __init__(self) -> None:
        super().__init__()
        self.at: list[float] = []

    def append(self, piece: str) -> None:
        self.at.append(time.time())
        super().append(piece)


@dataclass
class Kill:
    victim: str = ""
    at: float = 0.0
    published: float = 0.0  # the victim's sdcp_target_kv_published_total when it was killed


async def _pages_exist(store: Any, up: FaultUp, sessions: Sequence[bytes], epoch: int) -> bool:
    """Whether the MLC holds every session's target KV pages of ``epoch``."""
    from sdcp_fast.cache import object_uri
    from sdcp_fast.cache.uri import writer_tag

    # Each session's pages are named for the verifier that published them, whichever that is.
    tags = [writer_tag(svc.uri) for svc in up.services.values() if svc.role == "verifier"]

    async def published(s: bytes) -> bool:
        return any([await store.objects.contains(object_uri(up.scope, s, "target_kv", epoch, tag=t)) for t in tags])

    return all([await published(s) for s in sessions])


def run_with_a_kill(up: FaultUp, batch: Sequence[Job], timeout: float = 120.0) -> tuple[list[Seen], Kill]:
    """Stream every job at once; once every session has committed tokens and its epoch-1 pages
    are in the MLC, kill the busiest verifier with -9 and restart it (it comes back empty)."""
    kill = Kill()

    async def main() -> list[Seen]:
        from sdcp_fast.deploy.service import Security, remote_store

        client = Client(up)
        store = remote_store(up.mlc_url(), Security(*up.role_cert("router")))  # the router may read any object
        progress = asyncio.Event()
        seen = [Seen(job, pieces=Stamped()) for job in batch]
        try:
            streams = asyncio.gather(*(client.stream(s, progress) for s in seen))

            async def inject() -> None:
                deadline = time.monotonic() + 60
                while not all(s.pieces for s in seen):
                    assert time.monotonic() < deadline, "the sessions streamed nothing"
                    await asyncio.sleep(0.05)
                # Every session streams: the busiest verifier is measured while the pages are
                # published (its window took as long as a whole session on a quiet machine).
                victim = asyncio.create_task(busiest_verifier(up, window=0.2))
                while not await _pages_exist(store, up, [j.session for j in batch], 1):
                    assert time.monotonic() < deadline, "the sessions' target KV pages never reached the MLC"
                    await asyncio.sleep(0.05)
                kill.victim = await victim
                kill.published = await asyncio.to_thread(metric, up, kill.victim, "sdcp_target_kv_published_total")
                assert kill.published >= 1, f"{kill.victim} published no pages"
                assert not any(s.done for s in seen), "a session finished before the kill: make MAX_TOKENS larger"
                up.kill(kill.victim)
                kill.at = time.time()
                await asyncio.to_thread(up.restart)

            injector = asyncio.create_task(inject())
            done = list(await asyncio.wait_for(streams, timeout))
            await asyncio.wait_for(injector, timeout)
            return done
        finally:
            await client.close()
            await store.aclose()

    return asyncio.run(main()), kill


FAILOVER_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) sdcp_fast\.router WARNING session ([0-9a-f]{8}): "
                           r"verifier \S+ expired, failing over")


def failovers(up: FaultUp) -> dict[str, float]:
    """When the router began each session's fail-over (its log line, just before it opens the
    session at the new verifier), by the session id's first 8 hex digits."""
    assert up.services["router"].log_path is not None
    found = {}
    for line in up.services["router"].log_path.read_text().splitlines():
        if match := FAILOVER_LINE.match(line):
            # logging writes local time, as datetime reads it back.
            found[match[2]] = datetime.strptime(match[1], "%Y-%m-%d %H:%M:%S,%f").timestamp()
    return found


def stall(seen: Seen, at: float) -> tuple[float, float] | None:
    """(the stream's gap around ``at``, seconds from ``at`` to the first piece after it): what
    the client waited for across the fail-over; None if nothing streamed after ``at``."""
    times: list[float] = seen.pieces.at  # type: ignore[attr-defined]
    after = next((i for i, t in enumerate(times) if t > at), None)
    if after is None:
        return None
    before = times[after - 1] if after else at
    return times[after] - before, times[after] - at


def test_the_standby_resumes_from_published_pages_after_a_kill_9(kv_up: FaultUp, seed: int) -> None:
    """Three rule-1 sessions of ~220-token prompts; once each has committed tokens and published
    its pages, the busiest verifier is killed with -9 and restarted. Every session completes
    with its uninterrupted run's tokens, streamed once each, its log keeping the audit's
    invariants; each session failed over resumed at the other verifier from pages (none cold)."""
    from sdcp_fast.deploy.catalog import load_target
    from sdcp_fast.roles.frontend_text import HFTokenizer

    up = kv_up
    rng = random.Random(seed)
    batch, expected = steady_long_jobs(rng, SESSIONS)
    seen, kill = run_with_a_kill(up, batch)
    audits = check_batch(up, seen, expected, decode=HFTokenizer(load_target(TARGET).loaded.tokenizer).decode)

    failed_over = [(s, a) for s, a in zip(seen, audits, strict=True) if a.fences]
    assert failed_over, "no session was failed over"
    assert all(a.epochs == sorted(a.epochs) and a.fences == [2] for _, a in failed_over)
    survivor = next(n for n, svc in up.services.items() if svc.role == "verifier" and n != kill.victim)
    pages = metric(up, survivor, 'sdcp_resumes_total{kv="pages"')
    cold = metric(up, survivor, 'sdcp_resumes_total{kv="cold"')
    positions = metric(up, survivor, "sdcp_resumed_kv_positions_total")
    assert (pages, cold) == (len(failed_over), 0), f"resumes at {survivor}: {pages} from pages, {cold} cold"
    assert kill.published >= len(failed_over), "the victim published fewer page sets than it had sessions"
    assert positions > 0

    # Time to first token after the fail-over, as the client saw it: kill -> the first piece
    # after it, split at the router's fail-over (detection: the status expiry and the sweep;
    # resume: fence, read, open at the survivor importing the pages, assignment, first round).
    began = failovers(up)
    print(f"\nkilled {kill.victim} after {kill.published:.0f} page publishes; {len(failed_over)} of {len(seen)} "
          f"sessions failed over to {survivor}, each resumed from pages ({positions:.0f} positions imported)")
    rows = []
    for s, _ in failed_over:
        sid = s.job.session.hex()[:8]
        g, at = stall(s, kill.at), began.get(sid)
        before = sum(1 for t in s.pieces.at if t <= kill.at)  # type: ignore[attr-defined]
        if g is None or at is None:
            print(f"  session {sid}: {before} pieces before the kill; no piece after it or no fail-over logged")
            continue
        rows.append((g[1], at - kill.at, g[1] - (at - kill.at)))
        print(f"  session {sid}: {before} pieces before the kill; stream gap {g[0] * 1000:.0f} ms; kill to the "
              f"next piece {rows[-1][0] * 1000:.0f} ms = detection {rows[-1][1] * 1000:.0f} ms "
              f"+ resume {rows[-1][2] * 1000:.0f} ms")
    if rows:
        med = [statistics.median(r[i] for r in rows) * 1000 for i in range(3)]
        print(f"  TTFT after the fail-over (status ttl {STATUS_TTL_MS} ms), medians: kill to the next piece "
              f"{med[0]:.0f} ms, detection {med[1]:.0f} ms, router's fail-over to the next piece {med[2]:.0f} ms")
