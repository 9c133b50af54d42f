"""Admission at the front end (roles/frontend_admission.py, roles/frontend_server.py): a burst
over the per-key limit waits and is served, in order per key and in turn across keys; only a
full queue is refused (429); a client that leaves the queue takes no slot."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from sdcp_fast.roles.frontend_admission import Admission
from sdcp_fast.transport import loop

from .test_frontend import PROMPT
from .test_frontend_server import KEY, served


def test_waiters_go_in_order_per_key_and_in_turn_across_keys() -> None:
    async def scenario() -> tuple[list[str], list[bool]]:
        gate = Admission(per_key=2, total=1, queue=5)
        order: list[str] = []
        assert await gate.enter("a")  # the one slot

        async def one(holder: str, name: str) -> None:
            await gate.enter(holder)
            order.append(name)

        tasks = []
        for holder, name in (("a", "a1"), ("a", "a2"), ("a", "a3"), ("b", "b1"), ("c", "c1")):
            tasks.append(asyncio.ensure_future(one(holder, name)))
            await asyncio.sleep(0)
        full = [await gate.enter("d")]  # five waiting: the sixth is refused
        gate.leave("a")
        while len(order) < 5:
            await asyncio.sleep(0)
            if order and gate.in_flight:
                gate.leave(next(iter(gate.in_flight)))
        await asyncio.gather(*tasks)
        return order, full

    order, full = loop.run(scenario())
    assert full == [False]
    assert order == ["a1", "b1", "c1", "a2", "a3"]


def test_a_waiter_that_is_cancelled_leaves_the_queue_and_takes_no_slot() -> None:
    async def scenario() -> tuple[dict[str, int], int]:
        gate = Admission(per_key=1, queue=4)
        await gate.enter("a")
        waiting = asyncio.ensure_future(gate.enter("a"))
        await asyncio.sleep(0)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        gate.leave("a")
        return dict(gate.in_flight), gate.queued

    assert loop.run(scenario()) == ({}, 0)


def test_32_openai_clients_at_once_over_a_limit_of_16_are_all_served(tmp_path: Path) -> None:
    """The openai client's defaults (two retries, a second apart: Retry-After) against the default
    queue, with requests that take longer than the retries: none is refused."""
    openai = pytest.importorskip("openai", reason="the openai client is in the dev extra")

    async def scenario() -> list[str]:
        async with served(tmp_path, per_key=16, slow=0.25) as (_, url, _):
            client = openai.AsyncOpenAI(base_url=url, api_key=KEY, timeout=300)
            try:
                answers = await asyncio.gather(*(
                    client.completions.create(model="toy", prompt=PROMPT, max_tokens=32) for _ in range(32)))
            finally:
                await client.close()
            return [a.choices[0].text for a in answers]

    texts = loop.run(scenario())
    assert len(texts) == 32 and len(set(texts)) == 1 and texts[0]
