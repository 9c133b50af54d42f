"""Server-sent events as the front end streams them (roles/frontend.py): one JSON message per
event (``data: {...}``, a blank line), closed by ``data: [DONE]``, as OpenAI's API does.

Each event of a session's text carries an id, ``<session id, 32 hex digits>:<index>``: the
text sent up to and including that event is exactly the text of the session's first
``<index>`` output tokens, so a client that sends the same request again with that id as
``Last-Event-ID`` gets the rest (docs/frontend.md, "Resuming a stream"). The events after
the text (the finish chunk, usage) carry ``<session id>:end``.

:func:`event` writes one; :func:`messages` (or :func:`events`, with the ids) reads them back
from the chunks of a streamed response body, however the chunks split the events, for the
clients in this project (the demo, the harness, the fault tests).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterable, AsyncIterator, Mapping
from typing import Any

DONE = "[DONE]"  # what :func:`messages` yields for the closing event
DONE_EVENT = b"data: [DONE]\n\n"


END = "end"  # the index of the events after a session's text


def event(body: Mapping[str, Any], id: str | None = None) -> bytes:
    """One event carrying ``body`` as compact JSON, with ``id`` when given."""
    head = b"" if id is None else b"id: " + id.encode() + b"\n"
    return head + b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n"


def event_id(session: bytes, index: int | None) -> str:
    """The id of an event of ``session`` whose text ends at output token ``index`` (None:
    after the text)."""
    return f"{session.hex()}:{END if index is None else index}"


def parse_event_id(text: str) -> tuple[bytes, int | None]:
    """(session, index) of an id :func:`event_id` made; index None after the text. ValueError
    for anything else."""
    head, sep, tail = text.strip().partition(":")
    if not sep or len(head) != 32 or not (tail == END or (tail.isdigit() and tail.isascii() and len(tail) <= 12)):
        raise ValueError(f"not an event id of this API: {text[:80]!r}")
    try:
        session = bytes.fromhex(head)
    except ValueError:
        raise ValueError(f"not an event id of this API: {text[:80]!r}") from None
    return session, None if tail == END else int(tail)


def _fields(block: bytes) -> tuple[str | None, str]:
    """The id and the data of one event: its ``data:`` lines joined (one optional space after
    the colon dropped); comments and other fields are ignored."""
    lines, ident = [], None
    for line in block.decode().splitlines():
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "data":
            lines.append(value)
        elif name == "id":
            ident = value
    return ident, "\n".join(lines)


async def events(chunks: AsyncIterable[bytes]) -> AsyncIterator[tuple[str | None, Any]]:
    """(id, decoded JSON message) of each event in ``chunks``, in order, and :data:`DONE` as
    the message of the closing event; events without data are skipped."""
    buffer = b""
    async for chunk in chunks:
        buffer = (buffer + chunk).replace(b"\r\n", b"\n")
        while b"\n\n" in buffer:
            block, buffer = buffer.split(b"\n\n", 1)
            ident, data = _fields(block)
            if data == DONE:
                yield ident, DONE
            elif data:
                yield ident, json.loads(data)


async def messages(chunks: AsyncIterable[bytes]) -> AsyncIterator[Any]:
    """The decoded JSON message of each event in ``chunks`` (:func:`events` without the ids)."""
    async for _, message in events(chunks):
        yield message
