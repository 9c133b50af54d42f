from __future__ import annotations

import asyncio

import pytest

from sdcp_fast.cache import ObjectUnavailable, object_uri
from sdcp_fast.cache.aio import AsyncMLC


def test_async_adapter_round_trip(small_mlc):
    amlc = AsyncMLC(small_mlc)
    uri = object_uri(bytes(16), b"s" * 16, "q_rows", 1)

    async def scenario() -> None:
        stored = await amlc.put(uri, b"rows", 5)
        prefetch = asyncio.create_task(amlc.prefetch([uri]))
        assert bytes(await amlc.get(uri)) == b"rows"
        assert bytes(await amlc.get_range(uri, 1, 3)) == b"ow"
        assert (await amlc.head(uri)).leased
        assert await prefetch == [True]
        await amlc.release(stored.lease)
        await amlc.delete(uri)
        with pytest.raises(ObjectUnavailable):
            await amlc.get(uri)

    asyncio.run(scenario())
