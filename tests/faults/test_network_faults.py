"""Scenario 5 of the fault plan (§6.3, §6.9): every connection to a verifier runs through a
TCP proxy (faultkit.FaultProxy) that cuts connections and delays data at rates drawn from the
seed. A cut loses the requests and responses in flight on it (proposals, verdicts, output
reads, assignments, session opens), before or after the verifier acted on them; clients
retry, the verifier answers a repeated proposal with the verdict it already gave (§6.3), and
no round is committed twice. Delays hold data on one connection; HTTP/2 multiplexes many
requests on it, so requests and responses of different streams arrive out of their sending
order. The proxy works on TCP under TLS: it cannot duplicate or reorder bytes inside a
connection (TLS would refuse them); duplicates come from the retries a cut forces."""

from __future__ import annotations

import asyncio
import random

import pytest

from .faultkit import FaultUp, check_batch, metric, run_batch, steady_jobs

pytestmark = pytest.mark.services


def test_cut_and_delayed_connections_commit_no_round_twice(whole: FaultUp, seed: int) -> None:
    up = whole
    rng = random.Random(seed + 4)
    batch, expected = steady_jobs(rng, 6, 120, up.m)
    retries = sum(metric(up, n, "sdcp_proposal_retries_total") for n, s in up.services.items() if s.role == "drafter")

    async def faults(progress: asyncio.Event) -> None:
        up.faults(cut=0.02, delay=0.02)

    seen = run_batch(up, batch, faults)
    up.faults()
    check_batch(up, seen, expected)
    cuts = sum(p.cuts for p in up.proxies.values())
    assert cuts > 0
    after = sum(metric(up, n, "sdcp_proposal_retries_total") for n, s in up.services.items() if s.role == "drafter")
    assert after > retries, "no proposal was sent again"
