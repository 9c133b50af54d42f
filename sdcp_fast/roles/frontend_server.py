"""The client-facing listeners of the front end (:class:`~sdcp_fast.roles.frontend.Frontend`),
apart from the SDCP port, so that the plain ``openai`` client, ``curl`` and browsers'
libraries reach it with nothing but a URL and a key: HTTP/1.1 with aiohttp (:meth:`start`)
and, optionally, HTTP/2 on a second port with the project's HTTP/2 server
(:meth:`start_h2`). SDCP's own traffic between the roles keeps mutual TLS (§5.1); these
ports never take SDCP resources.

- Plain HTTP by default (meant for loopback; HTTP/2 then with prior knowledge, h2c); TLS
  with a server certificate when given (``certfile``/``keyfile``), no client certificate
  asked (HTTP/2 over TLS by ALPN ``h2``).
- API keys, as ``Authorization: Bearer KEY`` (or ``x-api-key``); none configured: no check.
  A wrong or missing key is 401 in OpenAI's error shape.
- At most ``per_key`` requests in flight per key (per client address without keys) and
  ``total`` in all; more wait their turn (:mod:`~sdcp_fast.roles.frontend_admission`), up to
  ``queue`` waiting: one more is 429 with ``Retry-After``.
- Bodies over ``max_body`` bytes are 413; every error is OpenAI-shaped JSON.
- A client that disconnects cancels its handler (``handler_cancellation``), and with it the
  session at its verifier (:meth:`~sdcp_fast.roles.router.RouterRole.cancel`).
"""

from __future__ import annotations

import hmac
import logging
import os
import ssl
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from aiohttp import web

from sdcp_fast.roles.frontend import Frontend
from sdcp_fast.roles.frontend_admission import PER_KEY, QUEUE, TOTAL, Admission
from sdcp_fast.roles.frontend_requests import ApiError
from sdcp_fast.transport.base import Request, Response
from sdcp_fast.transport.http1 import stream_to_aiohttp, to_aiohttp

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
    per_key: int = PER_KEY
    total: int | None = TOTAL
    queue: int = QUEUE
    max_body: int = MAX_BODY
    admission: Admission = field(init=False)
    _runner: web.AppRunner | None = None
    _h2: Any = None
    port: int = 0
    h2_port: int = 0

    def __post_init__(self) -> None:
        self.admission = Admission(self.per_key, self.total, self.queue)

    @property
    def _in_flight(self) -> dict[str, int]:
        return self.admission.in_flight

    def app(self) -> web.Application:
        app = web.Application(client_max_size=self.max_body)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        return app

    async def start(self, host: str = "127.0.0.1", port: int = 0, *, certfile: str | None = None,
                    keyfile: str | None = None) -> str:
        """Listen; the base URL of the API (``.../v1``)."""
        tls = _server_tls(certfile, keyfile, "http/1.1")
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

    async def start_h2(self, host: str = "127.0.0.1", port: int = 0, *, certfile: str | None = None,
                       keyfile: str | None = None) -> str:
        """Listen for HTTP/2 (h2c with prior knowledge on loopback, or TLS with ALPN h2); the
        base URL of the API. A stream the client resets closes the response's iterator, which
        cancels the session as a dropped HTTP/1.1 connection does."""
        from sdcp_fast.transport.h2server import serve

        tls = _server_tls(certfile, keyfile, "h2")
        self._h2 = await serve(self.handle, host, port, ssl=tls, insecure=tls is None)
        self.h2_port = int(self._h2.port)
        shown = f"[{host}]" if ":" in host else host
        return f"{'https' if tls is not None else 'http'}://{shown}:{self.h2_port}/v1"

    async def close(self) -> None:
        if self._h2 is not None:
            self._h2.close()
            await self._h2.wait_closed()
            self._h2 = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def handle(self, request: Request) -> Response:
        """One request of either listener, as the transport gives it: keys, limit, then the front end."""
        holder, refused = await self._admit(request.headers, "an HTTP/2 client")
        if refused is not None:
            return refused
        try:
            answer = await self._forward(request)
        except BaseException:
            self.admission.leave(holder)
            raise
        if answer.stream is None:
            self.admission.leave(holder)
            return answer
        return replace(answer, stream=_Counted(answer.stream, lambda: self.admission.leave(holder)))

    async def _forward(self, request: Request) -> Response:
        headers = dict(request.headers)
        if request.method == "POST" and headers.get("content-type", FORM).split(";")[0].strip() == FORM:
            headers["content-type"] = "application/json"  # plain curl -d says form; the API takes JSON only
        return await self.frontend.handle(replace(request, headers=headers, peer=None))

    # -- one request ----------------------------------------------------------------------

    def _key(self, headers: Mapping[str, str]) -> str | None:
        """The caller's key when it is one of ours; None otherwise."""
        auth = headers.get("authorization", "")
        given = auth[7:].strip() if auth[:7].lower() == "bearer " else headers.get("x-api-key", "")
        for key in self.keys:
            if hmac.compare_digest(given.encode(), key.encode()):
                return key
        return None

    async def _admit(self, headers: Mapping[str, str], remote: str) -> tuple[str, Response | None]:
        """Who holds the request (a key, or the client's address without keys) once it has a
        slot, or the answer that refuses it: 401 for a wrong key, 429 when the queue is full.
        An admitted request holds its slot until ``admission.leave``."""
        if self.keys:
            key = self._key(headers)
            if key is None:
                return "", _with(ApiError(401, "Incorrect API key provided; send it as 'Authorization: Bearer KEY'",
                                          kind="invalid_request_error", code="invalid_api_key"),
                                 {"www-authenticate": "Bearer"})
            holder = "key " + hmac.new(key.encode(), b"sdcp-fast", "sha256").hexdigest()[:8]
        else:
            holder = f"address {remote}"
        if not await self.admission.enter(holder):
            log.warning("%s: %d requests waiting, one more refused (429)", holder, self.queue)
            return "", _with(ApiError(429, f"{self.queue} requests are waiting (each key has at most "
                                           f"{self.per_key} in flight); retry later",
                                      kind="rate_limit_error", code="rate_limit_exceeded"),
                             {"retry-after": str(RETRY_AFTER_S)})
        return holder, None

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        holder, refused = await self._admit({k.lower(): v for k, v in request.headers.items()}, str(request.remote))
        if refused is not None:
            return to_aiohttp(refused)
        try:
            return await self._serve(request)
        finally:
            self.admission.leave(holder)

    async def _serve(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return _reply(ApiError(413, f"the body is over {self.max_body} bytes"))
        headers = {k.lower(): v for k, v in request.headers.items()}
        ours = Request(request.method, request.path, body=body, headers=headers, query=dict(request.query))
        answer = await self._forward(ours)
        if answer.stream is None:
            return to_aiohttp(answer)
        return await stream_to_aiohttp(request, answer)


class _Counted:
    """A streamed body whose request counts as in flight until it ends or is closed, started
    or not (the HTTP/2 server closes it when the client resets the stream)."""

    def __init__(self, stream: AsyncIterator[bytes], done: Callable[[], None]) -> None:
        self.stream, self._done = stream, done
        self.open = True

    def __aiter__(self) -> _Counted:
        return self

    async def __anext__(self) -> bytes:
        try:
            return await self.stream.__anext__()
        except StopAsyncIteration:
            self._end()
            raise

    async def aclose(self) -> None:
        self._end()
        await self.stream.aclose()  # type: ignore[attr-defined]

    def _end(self) -> None:
        if self.open:
            self.open = False
            self._done()


def _reply(error: ApiError) -> web.Response:
    return to_aiohttp(error.response())


def _with(error: ApiError, headers: Mapping[str, str]) -> Response:
    answer = error.response()
    return replace(answer, headers={**answer.headers, **headers})


def _server_tls(certfile: str | None, keyfile: str | None, alpn: str) -> ssl.SSLContext | None:
    """TLS with our server certificate and no client certificate asked; None: plain."""
    if certfile is None:
        return None
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.minimum_version = ssl.TLSVersion.TLSv1_2
    tls.load_cert_chain(certfile, keyfile)
    tls.set_alpn_protocols([alpn])
    return tls
