"""Scenarios 1 and 3 of the fault plan (§6.8, §6.9): verifiers killed with -9 at random
points of many concurrent sessions, and a verifier partitioned (SIGSTOP) past its status
expiry, then continued after the fail-over. No fault may change a committed token."""

from __future__ import annotations

import asyncio
import random

import pytest

from .faultkit import (
    FaultUp,
    busiest_verifier,
    check_batch,
    holder,
    run_batch,
    steady_jobs,
    stop_until_failed_over,
)

pytestmark = pytest.mark.services


def test_kill_9_of_verifiers_at_random_points_changes_no_committed_token(whole: FaultUp, seed: int) -> None:
    """Eight sessions (rule 1 and seeded rule 2 alternating); the verifier holding most of them
    is killed at a time drawn from the seed, restarted, and the one holding most then killed in
    turn. The kills land
    wherever the sessions are (waiting for proposals, scoring, between the append and the
    verdict, streaming output): each session still completes with its uninterrupted run's
    tokens, streamed once each, and its log shows each round once, epochs only going up."""
    up = whole
    rng = random.Random(seed)
    batch, expected = steady_jobs(rng, 8, 160, up.m)
    killed: list[str] = []
    held: dict[str, int] = {}  # per verifier killed, this batch's unfinished sessions it held

    async def faults(progress: asyncio.Event) -> None:
        # Each kill hits the verifier that holds most of this batch's unfinished sessions (the
        # routing records say which), not the busiest: in a long run sessions of earlier tests
        # can keep a verifier busy that holds none of this batch. The first kill soon after the
        # first token: on a quiet machine the whole batch can end within a second or two.
        sessions = [job.session for job in batch]
        for _ in range(2):
            await asyncio.sleep(rng.uniform(0.2, 1.5) if killed else rng.uniform(0.0, 0.3))
            name, hers = await holder(up, sessions, deadline=60.0 if not killed else 0.0)
            if not hers and killed:
                break  # the batch ended before the second kill: the first one landed
            held[name] = held.get(name, 0) + len(hers)
            up.kill(name)
            killed.append(name)
            await asyncio.to_thread(up.restart)

    seen = run_batch(up, batch, faults)
    audits = check_batch(up, seen, expected)
    assert any(held.values()), f"no kill landed on this batch's sessions mid-stream: {held}"
    assert any(a.fences for a in audits), "no session was failed over"
    assert all(a.epochs == sorted(a.epochs) for a in audits)


def test_a_partitioned_verifier_commits_and_releases_nothing_after_the_fence(whole: FaultUp, seed: int) -> None:
    """The busiest verifier is stopped (SIGSTOP) until the router has failed its sessions over,
    then continued: whatever it was doing, its appends meet the fence, so no record of its
    epoch follows the fence, and the output it still serves is of the old epoch, which the
    front end discards: every client sees its uninterrupted run's text."""
    up = whole
    rng = random.Random(seed + 1)
    batch, expected = steady_jobs(rng, 6, 420, up.m)  # long enough to be running at the stop
    stopped: list[str] = []

    async def faults(progress: asyncio.Event) -> None:
        await asyncio.sleep(rng.uniform(0.2, 1.0))
        name = await busiest_verifier(up)
        stopped.append(name)
        # Past the status expiry, and until the router has fenced one of these logs: on a loaded
        # machine that takes longer than any fixed multiple of the TTL.
        moved = await stop_until_failed_over(up, name, least=3 * up.status_ttl_ms / 1000,
                                             sessions=[job.session for job in batch])
        assert moved, f"the router failed nothing over while {name} was stopped"

    seen = run_batch(up, batch, faults)
    audits = check_batch(up, seen, expected)
    assert stopped
    fenced = [a for a in audits if a.fences]
    assert fenced, "no session was failed over"
    for a in fenced:  # check_batch's audit: no commit of a lower epoch after any fence
        assert a.epochs[-1] == a.fences[-1]


def test_seeded_rule2_repeats_its_uninterrupted_run_across_a_failover(whole: FaultUp, seed: int) -> None:
    up = whole
    rng = random.Random(seed + 7)
    batch, expected = steady_jobs(rng, 4, 120, up.m, rule2_every=1)

    async def faults(progress: asyncio.Event) -> None:
        await asyncio.sleep(rng.uniform(0.2, 1.0))
        up.kill(await busiest_verifier(up))
        await asyncio.to_thread(up.restart)

    check_batch(up, run_batch(up, batch, faults), expected, rule2_exact=True)
