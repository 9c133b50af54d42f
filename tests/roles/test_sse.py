"""Server-sent events (sdcp_fast/roles/sse.py): what the front end writes, read back however
the stream is cut into chunks."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest

from sdcp_fast.roles.sse import DONE, DONE_EVENT, event, event_id, events, messages, parse_event_id

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


def test_event_ids_name_the_session_and_the_output_index() -> None:
    session = bytes(range(16))
    assert event_id(session, 12) == session.hex() + ":12"
    assert event_id(session, None) == session.hex() + ":end"
    assert parse_event_id(event_id(session, 12)) == (session, 12)
    assert parse_event_id(event_id(session, None)) == (session, None)
    assert parse_event_id(" " + event_id(session, 0) + "\n") == (session, 0)
    for bad in ("", "12", session.hex(), session.hex() + ":", session.hex() + ":-1", session.hex() + ":x",
                "zz" * 16 + ":1", session.hex()[:-2] + ":1", session.hex() + ":1:2", session.hex() + ":１"):
        with pytest.raises(ValueError):
            parse_event_id(bad)


def test_ids_are_written_before_the_data_and_read_back() -> None:
    async def read() -> list[tuple[str | None, object]]:
        async def chunks() -> AsyncIterator[bytes]:
            yield event({"a": 1}, "s:1") + event({"b": 2}) + DONE_EVENT

        return [pair async for pair in events(chunks())]

    assert event({"a": 1}, "s:1") == b'id: s:1\ndata: {"a":1}\n\n'
    assert asyncio.run(read()) == [("s:1", {"a": 1}), (None, {"b": 2}), (None, DONE)]


def test_crlf_framed_events_read_back_with_chunks_cut_between_cr_and_lf() -> None:
    """Every line of every event ends in CRLF, the closing one too, and each chunk ends on a
    ``\\r`` whose ``\\n`` starts the next chunk: still one message per event, none lost."""
    raw = (b"".join(event(b, f"s:{i}") for i, b in enumerate(BODIES)) + DONE_EVENT).replace(b"\n", b"\r\n")
    cuts = [0, *(i + 1 for i in range(len(raw)) if raw[i:i + 1] == b"\r"), len(raw)]
    assert cuts[-2] == len(raw) - 1  # the last chunk is the closing event's last \n

    async def collect(pieces: Sequence[bytes]) -> list[tuple[str | None, Any]]:
        async def chunks() -> AsyncIterator[bytes]:
            for piece in pieces:
                yield piece

        return [pair async for pair in events(chunks())]

    want = [*((f"s:{i}", b) for i, b in enumerate(BODIES)), (None, DONE)]
    assert asyncio.run(collect([raw[a:b] for a, b in zip(cuts, cuts[1:], strict=False)])) == want
    for size in (1, 2, 3, 5):
        assert read(raw, size) == [m for _, m in want]
