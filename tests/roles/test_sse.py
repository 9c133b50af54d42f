"""Server-sent events (sdcp_fast/roles/sse.py): what the front end writes, read back however
the stream is cut into chunks."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest

from sdcp_fast.roles.sse import DONE, DONE_EVENT, event, messages

BODIES = [{"choices": [{"text": "the", "finish_reason": None}]}, {"choices": [], "usage": {"total_tokens": 3}},
          {"error": {"message": "a\n\nb"}}]


async def _chunks(raw: bytes, size: int) -> AsyncIterator[bytes]:
    for i in range(0, len(raw), size):
        yield raw[i:i + size]


def read(raw: bytes, size: int) -> Sequence[Any]:
    async def collect() -> list[Any]:
        return [m async for m in messages(_chunks(raw, size))]
    return asyncio.run(collect())


@pytest.mark.parametrize("size", [1, 2, 7, 1 << 16])
def test_written_events_read_back_whatever_the_chunks(size: int) -> None:
    raw = b"".join(event(b) for b in BODIES) + DONE_EVENT
    assert raw.startswith(b'data: {"choices":[{"text":"the"')  # compact JSON, one line an event
    assert read(raw, size) == [*BODIES, DONE]


def test_other_writers_lines_comments_and_empty_events() -> None:
    """CRLF line ends, data without the space, a message over two data lines, comments and
    other fields (ignored), an event without data (skipped)."""
    raw = b': keep-alive\r\n\r\nid: 1\r\ndata:{"a":\r\ndata: 1}\r\n\r\nevent: x\n\ndata: [DONE]\n\n'
    assert read(raw, 3) == [{"a": 1}, DONE]


def test_an_unfinished_event_is_not_read() -> None:
    assert read(event({"a": 1}) + b'data: {"b"', 4) == [{"a": 1}]
