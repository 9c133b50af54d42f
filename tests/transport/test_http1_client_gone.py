"""A streamed response written by ``stream_to_aiohttp`` (transport/http1.py; the front end's
client-facing listener, roles/frontend_server.py, uses it) whose client goes away: the
listener cancels the handler (``handler_cancellation``) while it waits for the stream's next
event; that wait ends with the handler, so no task is left to finish the stream alone ("Task
exception was never retrieved ... StopAsyncIteration" in the router's log), and the stream is
closed at once."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web

from sdcp_fast.transport import loop
from sdcp_fast.transport.base import Response
from sdcp_fast.transport.http1 import stream_to_aiohttp


class _Slow:
    """A stream: one event at once, then the end once ``finish`` is set."""

    def __init__(self) -> None:
        self.finish = asyncio.Event()
        self.closed: list[str] = []

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self

    async def __anext__(self) -> bytes:
        if not self.closed and not self.finish.is_set() and not getattr(self, "sent", False):
            self.sent = True
            return b"data: {}\n\n"
        await self.finish.wait()
        raise StopAsyncIteration

    async def aclose(self) -> None:
        self.closed.append("closed")


def test_a_client_gone_while_the_stream_waits_leaves_no_task_and_closes_the_stream() -> None:
    async def scenario() -> tuple[list[dict[str, Any]], list[str]]:
        unretrieved: list[dict[str, Any]] = []
        asyncio.get_running_loop().set_exception_handler(lambda _, context: unretrieved.append(context))
        stream = _Slow()
        handled = asyncio.Event()

        async def view(request: web.Request) -> web.StreamResponse:
            try:
                return await stream_to_aiohttp(request, Response(200, stream=stream))
            finally:
                handled.set()

        app = web.Application()
        app.router.add_get("/", view)
        runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            await reader.readuntil(b"data: {}")
            writer.transport.abort()
            await asyncio.wait_for(handled.wait(), 30)
            closed_at_once = list(stream.closed)
            stream.finish.set()
            for _ in range(10):
                await asyncio.sleep(0.01)
                gc.collect()
        finally:
            await runner.cleanup()
        return unretrieved, closed_at_once

    unretrieved, closed = loop.run(scenario())
    assert not unretrieved, [c.get("message") for c in unretrieved]
    assert closed == ["closed"]
