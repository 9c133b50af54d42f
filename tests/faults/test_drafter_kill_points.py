"""A drafter killed with -9 at a few seeded points across processes (docs/reliability.md,
"Drafter death"; the many points run in process: test_drafter_kill_campaign.py). Either drafter
may be the victim, the one proposing for a session or the other, at a seeded time after the
first piece streamed; it is restarted three ttl_ms later. No session may stall or fail: each
ends with all its tokens, its log keeps the audit's invariants, and a rule-1 one equals its
uninterrupted run."""

from __future__ import annotations

import asyncio
import random

import pytest

from .faultkit import FaultUp, check_batch, run_batch, steady_jobs

pytestmark = pytest.mark.services


@pytest.mark.parametrize("point", range(3))
def test_a_drafter_killed_at_a_seeded_point_neither_stalls_nor_fails_a_session(whole: FaultUp, seed: int,
                                                                               point: int) -> None:
    up = whole
    rng = random.Random(f"{seed}/drafter-kill/{point}")
    batch, expected = steady_jobs(rng, 4, 160, up.m)
    drafters = sorted(name for name, svc in up.services.items() if svc.role == "drafter")
    killed: list[str] = []

    async def faults(progress: asyncio.Event) -> None:
        await asyncio.sleep(rng.uniform(0.1, 1.5))
        victim = rng.choice(drafters)
        up.kill(victim)
        killed.append(victim)
        await asyncio.sleep(3 * up.status_ttl_ms / 1000)
        await asyncio.to_thread(up.restart)

    seen = run_batch(up, batch, faults)
    assert killed
    failed = [(s.job.session.hex(), s.error, s.finish) for s in seen if s.error is not None or s.finish != "length"]
    assert not failed, f"killed {killed}: {failed}"
    check_batch(up, seen, expected)
