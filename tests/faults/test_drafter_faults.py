"""Scenario 4 of the fault plan (§6.2, §6.9): a drafter killed with -9, and a drafter that
hangs (SIGSTOP) and comes back. Its status expires, the router assigns the sessions to the
other drafter within 2 x ttl_ms, the new drafter starts from the committed prefix (so the
text is the uninterrupted run's), and what the hung drafter sends later is refused
(sdcp-not-assigned)."""

from __future__ import annotations

import asyncio
import random
import signal
import time

import pytest

from .faultkit import FaultUp, busiest, check_batch, metric, run_batch, steady_jobs

pytestmark = pytest.mark.services

NOT_ASSIGNED = 'sdcp_problems_total{type="sdcp-not-assigned"}'


async def busiest_drafter(up: FaultUp) -> str:
    return await busiest(up, "drafter", "sdcp_proposals_total")


async def reassigned_after(up: FaultUp, before: float, t0: float, limit: float) -> float:
    """Seconds from ``t0`` until the router made an assignment after ``before`` of them."""
    while await asyncio.to_thread(metric, up, "router", "sdcp_assignments_total") <= before:
        assert time.monotonic() - t0 < limit, "no reassignment"
        await asyncio.sleep(0.05)
    return time.monotonic() - t0


def not_assigned(up: FaultUp) -> float:
    return sum(metric(up, name, NOT_ASSIGNED) for name, svc in up.services.items() if svc.role == "verifier")


def test_a_killed_drafter_is_replaced_within_two_ttl_and_the_text_is_unchanged(whole: FaultUp, seed: int) -> None:
    up = whole
    rng = random.Random(seed + 2)
    batch, expected = steady_jobs(rng, 6, 480, up.m)  # long enough to be running at the kill
    took: list[float] = []

    async def faults(progress: asyncio.Event) -> None:
        await asyncio.sleep(rng.uniform(0.2, 1.0))
        name = await busiest_drafter(up)
        before = await asyncio.to_thread(metric, up, "router", "sdcp_assignments_total")
        t0 = time.monotonic()
        up.kill(name)
        took.append(await reassigned_after(up, before, t0, 30))
        await asyncio.to_thread(up.restart)

    seen = run_batch(up, batch, faults)
    check_batch(up, seen, expected)
    ttl = up.status_ttl_ms / 1000
    assert took and took[0] < 2 * ttl, f"reassigned {took[0]:.2f} s after the kill (ttl {ttl} s)"


def test_a_hung_drafter_is_replaced_and_its_late_proposals_are_refused(whole: FaultUp, seed: int) -> None:
    up = whole
    rng = random.Random(seed + 3)
    batch, expected = steady_jobs(rng, 6, 220, up.m)
    refused_before = not_assigned(up)
    took: list[float] = []

    async def faults(progress: asyncio.Event) -> None:
        await asyncio.sleep(rng.uniform(0.2, 1.0))
        name = await busiest_drafter(up)
        before = await asyncio.to_thread(metric, up, "router", "sdcp_assignments_total")
        t0 = time.monotonic()
        up.signal(name, signal.SIGSTOP)
        try:
            took.append(await reassigned_after(up, before, t0, 30))
        finally:
            up.signal(name, signal.SIGCONT)

    seen = run_batch(up, batch, faults)
    check_batch(up, seen, expected)
    ttl = up.status_ttl_ms / 1000
    assert took and took[0] < 2 * ttl, f"reassigned {took[0]:.2f} s after the hang (ttl {ttl} s)"
    assert not_assigned(up) > refused_before, "the hung drafter proposed nothing after it came back"
