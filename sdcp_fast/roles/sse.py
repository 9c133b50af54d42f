"""Server-sent events as the front end streams them (roles/frontend.py): one JSON message per
event (``data: {...}``, a blank line), closed by ``data: [DONE]``, as OpenAI's API does.

:func:`event` writes one; :func:`messages` reads them back from the chunks of a streamed
response body, however the chunks split the events, for the clients in this project (the
demo, the harness, the fault tests).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterable, AsyncIterator, Mapping
from typing import Any

DONE = "[DONE]"  # what :func:`messages` yields for the closing event
DONE_EVENT = b"data: [DONE]\n\n"


def event(body: Mapping[str, Any]) -> bytes:
    """One event carrying ``body`` as compact JSON."""
    return b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n"


def _data(block: bytes) -> str:
    """The data of one event: its ``data:`` lines joined (one optional space after the colon
    dropped); comments and other fields are ignored."""
    lines = []
    for line in block.decode().splitlines():
        if line.startswith("data:"):
            value = line[5:]
            lines.append(value[1:] if value.startswith(" ") else value)
    return "\n".join(lines)


async def messages(chunks: AsyncIterable[bytes]) -> AsyncIterator[Any]:
    """The decoded JSON message of each event in ``chunks``, in order, and :data:`DONE` for
    the closing event; events without data are skipped."""
    buffer = b""
    async for chunk in chunks:
        buffer = (buffer + chunk).replace(b"\r\n", b"\n")
        while b"\n\n" in buffer:
            block, buffer = buffer.split(b"\n\n", 1)
            data = _data(block)
            if data == DONE:
                yield DONE
            elif data:
                yield json.loads(data)
