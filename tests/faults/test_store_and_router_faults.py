"""Scenarios 6 and 7 of the fault plan: the MLC process (object store and commit logs)
killed with -9 and restarted mid-run (§6.8: a verifier releases nothing it could not append;
the session then resumes, or fails cleanly), and the router killed and restarted (§6.9: the
verifiers and drafters carry their sessions on without it; the committed output stays)."""

from __future__ import annotations

import asyncio
import random
import time

import pytest

from .faultkit import FaultUp, audit, check_batch, run_batch, steady_jobs, words

pytestmark = pytest.mark.services


def test_an_mlc_restart_mid_run_releases_nothing_unappended(whole: FaultUp, seed: int) -> None:
    """While the MLC is down no append succeeds, so no verdict and no output is released; once
    it is back the sessions go on from their logs. A session that could not (its drafter gave
    up retrying) fails with an error: it never shows a token its log does not hold."""
    up = whole
    rng = random.Random(seed + 5)
    batch, expected = steady_jobs(rng, 6, 120, up.m)

    async def faults(progress: asyncio.Event) -> None:
        await asyncio.sleep(rng.uniform(0.2, 1.0))
        up.kill("mlc")
        await asyncio.to_thread(up.restart)

    seen = run_batch(up, batch, faults)
    done = [(s, e) for s, e in zip(seen, expected, strict=True) if s.error is None]
    for s, tokens in zip(seen, expected, strict=True):
        a = audit(up, s.job.session)  # the log's invariants hold either way
        if s.job.seed is None:  # rule 2: docs/reliability.md, "Rule 2 and the shape of rounds"
            assert a.tokens == list(tokens[:len(a.tokens)])
        assert words(a.tokens)[:len(s.words)] == s.words, "a token released that the log lacks"
    check_batch(up, [s for s, _ in done], [e for _, e in done])
    assert done, "no session completed after the MLC restart"


def test_a_router_restart_keeps_the_committed_output_of_sessions_in_flight(whole: FaultUp, seed: int) -> None:
    """The clients' streams end with the router; the sessions' committed output does not: each
    log keeps its invariants and what a client saw is a prefix of it, and the drafters and
    verifiers carry the sessions on without the router (proposals and verdicts go directly
    between them); the restarted router adopts them from their routing records
    (docs/reliability.md, "What the router persists, and why")."""
    up = whole
    rng = random.Random(seed + 6)
    batch, expected = steady_jobs(rng, 6, 140, up.m)

    async def faults(progress: asyncio.Event) -> None:
        await asyncio.sleep(rng.uniform(0.2, 1.0))
        up.kill("router")
        await asyncio.to_thread(up.restart)

    seen = run_batch(up, batch, faults)
    assert any(s.error for s in seen), "the router was killed after every stream had ended"
    lengths: list[int] = []
    deadline = time.monotonic() + 60
    while True:  # until every log is complete or has stopped growing
        now = [len(audit(up, s.job.session).tokens) for s in seen]
        if now == lengths or all(n == s.job.max_tokens for n, s in zip(now, seen, strict=True)):
            break
        assert time.monotonic() < deadline
        lengths = now
        time.sleep(3)
    grew = 0
    for s, tokens in zip(seen, expected, strict=True):
        a = audit(up, s.job.session)
        if s.job.seed is None:  # rule 2: docs/reliability.md, "Rule 2 and the shape of rounds"
            assert a.tokens == list(tokens[:len(a.tokens)])
        assert words(a.tokens)[:len(s.words)] == s.words
        grew += len(words(a.tokens)) > len(s.words)
    assert grew, "no session went on without the router"
