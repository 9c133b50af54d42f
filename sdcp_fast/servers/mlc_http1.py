"""The MLC's routes (:class:`~sdcp_fast.servers.mlc.MLCService`) as an aiohttp HTTP/1.1
application: ``sdcp-fast mlc --http1``, for debugging with HTTP/1.1 tools.

Bodies are read in chunks against their route's limit (a declared Content-Length over it is
refused unread), taken from the upload budget as they arrive, and released as soon as the
request ends, also when the client goes away mid-body. A refused body is not drained: the
answer goes out and the connection is closed.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from sdcp_fast.cache.store import MLC
from sdcp_fast.commitlog.directory import LogDirectory
from sdcp_fast.protocol.problems import PROBLEM_MEDIA_TYPE
from sdcp_fast.servers import mlc as core
from sdcp_fast.servers.mlc import BodyTooLarge, Call, Incomplete, MLCService, UploadBudget, answer_for
from sdcp_fast.transport.base import Response
from sdcp_fast.transport.tls import peer_of

log = logging.getLogger("sdcp_fast.servers.mlc")
SERVICE_KEY = web.AppKey("mlc_service", MLCService)
View = Callable[[web.Request], Awaitable[web.StreamResponse]]


async def read_body(request: web.Request, limit: int, budget: UploadBudget | None = None) -> bytearray:
    """The body, at most ``limit`` bytes; a declared length over it is refused unread. Bytes
    are taken from ``budget`` as they arrive (the caller gives ``len(body)`` back when done).
    On any failure (client gone, over a limit) the bytes read so far are freed and given back
    at once rather than left to whatever keeps the failed frame alive."""
    declared = request.content_length
    if declared is not None and declared > limit:
        raise BodyTooLarge(f"body of {declared} bytes; this route takes at most {limit}", extra={"limit": limit})
    buf = bytearray()
    try:
        async for chunk in request.content.iter_any():
            if len(buf) + len(chunk) > limit:
                raise BodyTooLarge(f"body over {limit} bytes", extra={"limit": limit})
            if budget is not None:
                budget.take(len(chunk))
            buf += chunk
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
        return await read_body(self.request, limit, budget)


def _to_aiohttp(response: Response, *, keep_length: bool = False) -> web.Response:
    headers = {k: v for k, v in response.headers.items() if keep_length or k != "content-length"}
    return web.Response(status=response.status, body=response.body if response.body else None, headers=headers)


@web.middleware
async def problems(request: web.Request, handler: View) -> web.StreamResponse:
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        # aiohttp's own refusals (no such route, wrong method, ...) as problem details too.
        body = json.dumps({"type": "about:blank", "title": exc.reason, "status": exc.status}).encode()
        resp = web.Response(status=exc.status, body=body, content_type=PROBLEM_MEDIA_TYPE,
                            headers={k: v for k, v in exc.headers.items() if k.lower() == "allow"})
    except Exception as exc:
        resp = _to_aiohttp(answer_for(exc, request.method, request.path))
    if not request.content.is_eof():
        # A refused body is neither read nor drained (aiohttp would linger up to 10 s
        # reading it): answer, then close the connection.
        resp.force_close()
        await resp.prepare(request)
        await resp.write_eof()
        request.protocol.force_close()
    return resp


def _view(route: str) -> View:
    async def view(request: web.Request) -> web.StreamResponse:
        service = request.app[SERVICE_KEY]
        response: Response = await getattr(service, route)(_StreamedCall(request), **request.match_info)
        # aiohttp keeps an explicit Content-Length on a bodiless HEAD response.
        return _to_aiohttp(response, keep_length=request.method == "HEAD")

    return view


def init_app(mlc: MLC, logs: LogDirectory | None = None, *, inflight_bytes: int = core.MAX_INFLIGHT,
             on_close: Callable[[], None] | None = None) -> web.Application:
    """The MLC's application: objects and leases of ``mlc``, commit logs of ``logs`` (none
    when None), at most ``inflight_bytes`` of object bodies held at once; ``on_close`` runs
    at clean-up (e.g. ``EmbeddedStore.close``)."""
    app = web.Application(middlewares=[problems], client_max_size=core.MAX_BODY)
    app[SERVICE_KEY] = MLCService(mlc, logs, inflight_bytes=inflight_bytes)
    obj = "/objects/{name:.+}"
    app.router.add_put(obj, _view("put_object"))
    app.router.add_get(obj, _view("get_object"), allow_head=False)
    app.router.add_route("HEAD", obj, _view("head_object"))
    app.router.add_delete(obj, _view("delete_object"))
    app.router.add_post("/leases", _view("create_lease"))
    app.router.add_put("/leases/{lease}", _view("renew_lease"))
    app.router.add_delete("/leases/{lease}", _view("release_lease"))
    app.router.add_get("/logs/{name:.+}", _view("read_log"))
    app.router.add_post("/logs/{name:.+}", _view("append_log"))
    app.router.add_get("/stats", _view("stats"))
    app.router.add_get("/metrics", _view("metrics"))
    if on_close is not None:
        async def closing(app: web.Application) -> Any:
            yield
            on_close()

        app.cleanup_ctx.append(closing)
    return app
