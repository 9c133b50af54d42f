"""The client-facing listener of the front end (:class:`~sdcp_fast.roles.frontend.Frontend`):
HTTP/1.1 with aiohttp, apart from the SDCP port, so that the plain ``openai`` client, ``curl``
and browsers' libraries reach it with nothing but a URL and a key. SDCP's own traffic between
the roles keeps mutual TLS (§5.1); this port never takes SDCP resources.

- Plain HTTP by default (meant for loopback); TLS with a server certificate when given
  (``certfile``/``keyfile``), no client certificate asked.
- API keys, as ``Authorization: Bearer KEY`` (or ``x-api-key``); none configured: no check.
  A wrong or missing key is 401 in OpenAI's error shape.
- At most ``per_key`` requests in flight per key (per client address without keys): one more
  is 429 with ``Retry-After``.
- Bodies over ``max_body`` bytes are 413; every error is OpenAI-shaped JSON.
- A client that disconnects cancels its handler (``handler_cancellation``), and with it the
  session at its verifier (:meth:`~sdcp_fast.roles.router.RouterRole.cancel`).
"""

from __future__ import annotations

import hmac
import logging
import os
import ssl
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web

from sdcp_fast.roles.frontend import ApiError, Frontend
from sdcp_fast.transport.base import Request

log = logging.getLogger("sdcp_fast.frontend")

API_KEY_ENV = "SDCP_FAST_API_KEY"
MAX_BODY = 4 << 20  # bytes: a prompt of a whole context in JSON fits many times over
RETRY_AFTER_S = 1
FORM = "application/x-www-form-urlencoded"


def api_keys(keys: Iterable[str] = (), key_file: str | None = None, env: bool = True) -> tuple[str, ...]:
    """The keys from the command line, a file (one a line, ``#`` comments) and ``$SDCP_FAST_API_KEY``."""
    out = [k for k in keys if k]
    if key_file is not None:
        for line in Path(key_file).read_text().splitlines():
            line = line.strip()
            if line and not line.startswith("#"):
                out.append(line)
    if env and os.environ.get(API_KEY_ENV):
        out.append(os.environ[API_KEY_ENV])
    return tuple(dict.fromkeys(out))


@dataclass
class FrontendServer:
    """The aiohttp application in front of ``frontend``; :meth:`start` listens."""

    frontend: Frontend
    keys: tuple[str, ...] = ()
    per_key: int = 16
    max_body: int = MAX_BODY
    _in_flight: dict[str, int] = field(default_factory=dict)
    _runner: web.AppRunner | None = None
    port: int = 0

    def app(self) -> web.Application:
        app = web.Application(client_max_size=self.max_body)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        return app

    async def start(self, host: str = "127.0.0.1", port: int = 0, *, certfile: str | None = None,
                    keyfile: str | None = None) -> str:
        """Listen; the base URL of the API (``.../v1``)."""
        tls = None
        if certfile is not None:
            tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            tls.load_cert_chain(certfile, keyfile)
        # handler_cancellation: a client that goes away cancels its request, so its session ends.
        self._runner = web.AppRunner(self.app(), handler_cancellation=True, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port, ssl_context=tls)
        await site.start()
        server = site._server
        assert server is not None and server.sockets  # type: ignore[attr-defined]
        self.port = int(server.sockets[0].getsockname()[1])  # type: ignore[attr-defined]
        scheme = "https" if tls is not None else "http"
        shown = f"[{host}]" if ":" in host else host
        return f"{scheme}://{shown}:{self.port}/v1"

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # -- one request ----------------------------------------------------------------------

    def _key(self, request: web.Request) -> str | None:
        """The caller's key when it is one of ours; None otherwise."""
        auth = request.headers.get("authorization", "")
        given = auth[7:].strip() if auth[:7].lower() == "bearer " else request.headers.get("x-api-key", "")
        for key in self.keys:
            if hmac.compare_digest(given.encode(), key.encode()):
                return key
        return None

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        if self.keys:
            key = self._key(request)
            if key is None:
                return _reply(ApiError(401, "Incorrect API key provided; send it as 'Authorization: Bearer KEY'",
                                       kind="invalid_request_error", code="invalid_api_key"),
                              {"www-authenticate": "Bearer"})
            holder = "key " + hmac.new(key.encode(), b"sdcp-fast", "sha256").hexdigest()[:8]
        else:
            holder = f"address {request.remote}"
        if self._in_flight.get(holder, 0) >= self.per_key:
            log.warning("%s: %d requests in flight, one more refused (429)", holder, self.per_key)
            return _reply(ApiError(429, f"at most {self.per_key} requests in flight per key; retry later",
                                   kind="rate_limit_error", code="rate_limit_exceeded"),
                          {"retry-after": str(RETRY_AFTER_S)})
        self._in_flight[holder] = self._in_flight.get(holder, 0) + 1
        try:
            return await self._serve(request)
        finally:
            self._in_flight[holder] -= 1
            if not self._in_flight[holder]:
                del self._in_flight[holder]

    async def _serve(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return _reply(ApiError(413, f"the body is over {self.max_body} bytes"))
        headers = {k.lower(): v for k, v in request.headers.items()}
        if request.method == "POST" and headers.get("content-type", FORM).split(";")[0].strip() == FORM:
            headers["content-type"] = "application/json"  # plain curl -d says form; the API takes JSON only
        ours = Request(request.method, request.path, body=body, headers=headers, query=dict(request.query))
        answer = await self.frontend.handle(ours)
        if answer.stream is None:
            return web.Response(status=answer.status, body=answer.body, headers=answer.headers)
        reply = web.StreamResponse(status=answer.status, headers=answer.headers)
        await reply.prepare(request)
        stream = answer.stream
        try:
            async for chunk in stream:
                await reply.write(chunk)
        finally:
            await stream.aclose()  # type: ignore[attr-defined]
        await reply.write_eof()
        return reply


def _reply(error: ApiError, headers: dict[str, str] | None = None) -> web.Response:
    answer = error.response()
    return web.Response(status=answer.status, body=answer.body, headers={**answer.headers, **(headers or {})})
