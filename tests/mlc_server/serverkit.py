"""Run an MLC server on loopback in a background thread (tests and the bench): the HTTP/2
server (``http2=True``, what ``sdcp-fast mlc`` serves) or the aiohttp HTTP/1.1 one; and the
memory those servers hold, measured from the test's side."""

from __future__ import annotations

import asyncio
import gc
import os
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from sdcp_fast.cache.http_client import RemoteMLC, mlc_transport
from sdcp_fast.cache.index import MLC
from sdcp_fast.commitlog.directory import LogDirectory
from sdcp_fast.commitlog.http import HttpCommitLog
from sdcp_fast.transport.base import Response
from sdcp_fast.transport.loop import LoopThread

WIRES = ("h2", "http1")
ALPN = {"h2": "h2", "http1": "http/1.1"}  # what a server of each wire offers in its handshake


class Served(str):
    """The base URL, with the server's event loop (tests schedule probes on it) and wire."""

    loop: asyncio.AbstractEventLoop
    http1: bool

    def client(self, **kwargs: Any) -> RemoteMLC:
        """A blocking MLC client speaking this server's protocol."""
        return RemoteMLC(self, http1=self.http1, **kwargs)

    def log(self, name: str, **kwargs: Any) -> HttpCommitLog:
        return HttpCommitLog.on_server(self, name, http1=self.http1, **kwargs)

    def fetch(self, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None) -> Response:
        """One raw request on this server's protocol, from any thread (one shared client
        connection, closed with the server)."""
        if self._fetcher is None:
            runner = LoopThread("mlc-test-fetch")

            async def make() -> Any:
                return mlc_transport(None, http1=self.http1)

            self._fetcher = (runner, runner.run(make()))
        runner, transport = self._fetcher
        return runner.run(transport.request(self, method, path.lstrip("/"), body=body, headers=headers))

    _fetcher: tuple[LoopThread, Any] | None = None

    def close_fetcher(self) -> None:
        if self._fetcher is not None:
            runner, transport = self._fetcher
            runner.run(transport.close())
            runner.stop()


@contextmanager
def serving(mlc: MLC, ssl_ctx: ssl.SSLContext | None = None, *, logs: LogDirectory | None = None,
            http2: bool = False, **app_kwargs: Any) -> Iterator[Served]:
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    port: list[int] = []
    stop: list[Any] = []
    failed: list[BaseException] = []

    async def start_http1() -> None:
        from aiohttp import web

        from sdcp_fast.mlc_server.server_http1 import init_app

        runner = web.AppRunner(init_app(mlc, logs, **app_kwargs))
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ssl_ctx)
        await site.start()
        port.append(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]
        stop.append(runner.cleanup)

    async def start_http2() -> None:
        from sdcp_fast.mlc_server.server import MLCService, serve

        if ssl_ctx is not None:
            ssl_ctx.set_alpn_protocols(["h2"])
        server = await serve(MLCService(mlc, logs, **app_kwargs), "127.0.0.1", 0, ssl=ssl_ctx,
                             insecure=ssl_ctx is None)
        port.append(server.port)

        async def close() -> None:
            try:
                server.close()
            except AttributeError:
                # H2Protocol.close writes its GOAWAY to a TLS transport already closing
                # when a client has just left (reported: it should check is_closing()).
                pass
            await server.wait_closed()

        stop.append(close)

    def run() -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(start_http2() if http2 else start_http1())
        except BaseException as exc:  # noqa: BLE001 - reported by the waiting test
            failed.append(exc)
            ready.set()
            return
        ready.set()
        loop.run_forever()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert ready.wait(10), "MLC server did not start"
    if failed:
        raise failed[0]
    base = Served(f"{'https' if ssl_ctx else 'http'}://127.0.0.1:{port[0]}")
    base.loop = loop
    base.http1 = not http2
    try:
        yield base
    finally:
        base.close_fetcher()
        asyncio.run_coroutine_threadsafe(stop[0](), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def rss() -> int:
    """This process's resident memory in bytes (the servers under test run in it)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def rss_growth_over_abandoned_uploads(abandon: Callable[[int, int], None], *, collect_cycles: bool = True) -> int:
    """Bytes the process grew by over four uploads ``abandon(declared, sent)`` left half-sent
    (after one warm-up: allocator arenas, connection objects); with ``collect_cycles`` off,
    nothing a reference cycle holds is freed meanwhile."""
    gc.collect()
    if not collect_cycles:
        gc.disable()
    try:
        abandon(64 << 20, 32 << 20)
        time.sleep(0.3)
        before = rss()
        for _ in range(4):
            abandon(96 << 20, 48 << 20)
        time.sleep(0.5)
        return rss() - before
    finally:
        gc.enable()
