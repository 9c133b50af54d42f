"""Run the MLC's aiohttp app on loopback in a background thread (tests and the bench)."""

from __future__ import annotations

import asyncio
import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from aiohttp import web

from sdcp_fast.cache.store import MLC
from sdcp_fast.commitlog.directory import LogDirectory
from sdcp_fast.servers.mlc_http1 import init_app


class Served(str):
    """The base URL, with the server's event loop (tests schedule probes on it)."""

    loop: asyncio.AbstractEventLoop


@contextmanager
def serving(mlc: MLC, ssl_ctx: ssl.SSLContext | None = None, *, logs: LogDirectory | None = None,
            **app_kwargs: Any) -> Iterator[Served]:
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(init_app(mlc, logs, **app_kwargs))
    ready = threading.Event()
    port: list[int] = []

    async def start() -> None:
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ssl_ctx)
        await site.start()
        port.append(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]

    def run() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(start())
        ready.set()
        loop.run_forever()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert ready.wait(10), "MLC server did not start"
    base = Served(f"{'https' if ssl_ctx else 'http'}://127.0.0.1:{port[0]}")
    base.loop = loop
    try:
        yield base
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
