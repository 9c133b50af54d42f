"""The MLC server (:class:`~sdcp_fast.mlc_server.server.MLCService`, its one route table) as an
aiohttp HTTP/1.1 application: ``sdcp-fast mlc --http1``, for debugging with HTTP/1.1 tools.

Bodies are read in chunks against their route's limit (a declared Content-Length over it is
refused unread), taken from the upload budget as they arrive, and released as soon as the
request ends, also when the client goes away mid-body or stalls: a body not complete within
``request_timeout`` (60 s, as on HTTP/2) is answered 408 and its bytes given back, so idle
uploads cannot hold the budget and refuse everyone else. A refused body is not drained:
the answer goes out and the connection is closed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from aiohttp import web

from sdcp_fast.cache.index import MLC
from sdcp_fast.commitlog.directory import LogDirectory
from sdcp_fast.mlc_server import server
from sdcp_fast.mlc_server.server import MLCService
from sdcp_fast.mlc_server.server_requests import (
    BodyTimeout,
    BodyTooLarge,
    Call,
    Incomplete,
    UploadBudget,
    answer_for,
)
from sdcp_fast.transport.http1 import to_aiohttp
from sdcp_fast.transport.tls import peer_of

SERVICE_KEY = web.AppKey("mlc_service", MLCService)
TIMEOUT_KEY = web.AppKey("mlc_request_timeout", float)
REQUEST_TIMEOUT = 60.0  # seconds for a whole body to arrive (the HTTP/2 transport's default)


async def read_body(request: web.Request, limit: int, budget: UploadBudget | None = None,
                    timeout: float = REQUEST_TIMEOUT) -> bytearray:
    """The body, at most ``limit`` bytes within ``timeout`` seconds; a declared length over the
    limit is refused unread. Bytes are taken from ``budget`` as they arrive (the caller gives
    ``len(body)`` back when done). On any failure (client gone or stalled, over a limit) the
    bytes read so far are freed and given back at once rather than left to whatever keeps
    the failed frame alive."""
    declared = request.content_length
    if declared is not None and declared > limit:
        raise BodyTooLarge(f"body of {declared} bytes; this route takes at most {limit}", extra={"limit": limit})
    buf = bytearray()
    try:
        try:
            async with asyncio.timeout(timeout):
                async for chunk in request.content.iter_any():
                    if len(buf) + len(chunk) > limit:
                        raise BodyTooLarge(f"body over {limit} bytes", extra={"limit": limit})
                    if budget is not None:
                        budget.take(len(chunk))
                    buf += chunk
        except TimeoutError:
            raise BodyTimeout(f"request body not complete within {timeout:g} s ({len(buf)} bytes came)") from None
    except BaseException:
        if budget is not None:
            budget.give(len(buf))
        del buf[:]
        raise
    if declared is not None and len(buf) != declared:
        raise Incomplete(f"{len(buf)} of {declared} bytes")
    return buf


class _StreamedCall(Call):
    def __init__(self, request: web.Request) -> None:
        transport = request.transport
        super().__init__(request.method, request.path.lstrip("/"), request.query,
                         {k.lower(): v for k, v in request.headers.items()},
                         peer_of(transport.get_extra_info("ssl_object")) if transport is not None else None)
        self.request = request

    async def body(self, limit: int, budget: UploadBudget | None = None) -> bytearray:
        return await read_body(self.request, limit, budget, self.request.app[TIMEOUT_KEY])


async def _view(request: web.Request) -> web.StreamResponse:
    """Every request, routed by the service's one route table."""
    try:
        answer = await request.app[SERVICE_KEY].dispatch(_StreamedCall(request))
    except Exception as exc:
        answer = answer_for(exc, request.method, request.path)
    # aiohttp keeps an explicit Content-Length on a bodiless HEAD response.
    resp = to_aiohttp(answer, keep_length=request.method == "HEAD" and answer.status < 400)
    if not request.content.is_eof():
        # A refused body is neither read nor drained (aiohttp would linger up to 10 s
        # reading it): answer, then close the connection.
        resp.force_close()
        await resp.prepare(request)
        await resp.write_eof()
        request.protocol.force_close()
    return resp


def init_app(mlc: MLC, logs: LogDirectory | None = None, *, inflight_bytes: int = server.MAX_INFLIGHT,
             request_timeout: float = REQUEST_TIMEOUT, on_close: Callable[[], None] | None = None) -> web.Application:
    """The MLC's application: objects and leases of ``mlc``, commit logs of ``logs`` (none
    when None), at most ``inflight_bytes`` of object bodies held at once, each body within
    ``request_timeout`` seconds; ``on_close`` runs at clean-up (e.g. ``LocalStore.close``)."""
    app = web.Application(client_max_size=server.MAX_BODY)
    app[SERVICE_KEY] = MLCService(mlc, logs, inflight_bytes=inflight_bytes)
    app[TIMEOUT_KEY] = request_timeout
    app.router.add_route("*", "/{tail:.*}", _view)
    if on_close is not None:
        async def closing(app: web.Application) -> Any:
            yield
            on_close()

        app.cleanup_ctx.append(closing)
    return app
