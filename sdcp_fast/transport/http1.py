"""HTTP/1.1 through aiohttp, for debugging only (§5.1 requires HTTP/2; never the default).

:func:`serve_http1` serves the same :data:`~sdcp_fast.transport.base.Handler` as
:func:`~sdcp_fast.transport.h2server.serve`, with the peer taken from the verified client
certificate the same way (:func:`~sdcp_fast.transport.tls.peer_of`); :class:`Http1Transport`
is a matching client. Use them with HTTP/1.1 tools (``curl --http1.1``, a browser, a proxy
that speaks no HTTP/2); build their contexts with ``alpn=("http/1.1",)``. A streamed
response (``Response.stream``) goes out with chunked transfer encoding, each chunk as it is
produced; when the client disconnects, the iterator is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl as ssl_module
from collections.abc import AsyncIterator, Mapping
from typing import cast
from urllib.parse import quote, urlsplit

import aiohttp
from aiohttp import web

from sdcp_fast.transport.base import Handler, Request, Response
from sdcp_fast.transport.binding import check_insecure
from sdcp_fast.transport.errors import TransportError, TransportTimeout
from sdcp_fast.transport.fields import HOP_BY_HOP
from sdcp_fast.transport.h2conn import Limits
from sdcp_fast.transport.problem import INTERNAL_ERROR_DETAIL, http_problem
from sdcp_fast.transport.tls import peer_of

log = logging.getLogger("sdcp_fast.transport")


def to_aiohttp(response: Response, *, keep_length: bool = False) -> web.Response:
    """``response`` as aiohttp's; ``keep_length`` keeps a bodiless HEAD answer's Content-Length."""
    dropped = HOP_BY_HOP if keep_length else HOP_BY_HOP | {"content-length"}
    headers = {k: v for k, v in response.headers.items() if k.lower() not in dropped}
    return web.Response(status=response.status, body=response.body or None, headers=headers)


_LEFT_CHECK = 0.25  # seconds between checks for a client that left a streamed response


async def stream_to_aiohttp(request: web.Request, response: Response) -> web.StreamResponse:
    """``response``'s stream written to ``request``'s client; a client that leaves ends it, and the
    stream is closed in every case."""
    assert response.stream is not None
    headers = {k: v for k, v in response.headers.items() if k.lower() not in HOP_BY_HOP | {"content-length"}}
    out = web.StreamResponse(status=response.status, headers=headers)
    out.enable_chunked_encoding()
    chunks = response.stream.__aiter__()
    following: asyncio.Future[bytes] | None = None
    try:
        await out.prepare(request)
        while True:
            # aiohttp does not tell a handler that its client left (unless it cancels every
            # handler, which SDCP's must not be); look at the socket while the producer waits.
            following = asyncio.ensure_future(chunks.__anext__())
            while not (await asyncio.wait([following], timeout=_LEFT_CHECK))[0]:
                if request.transport is None or request.transport.is_closing():
                    following.cancel()
                    await asyncio.wait([following])
                    raise ConnectionResetError("client left")
            try:
                chunk = following.result()
            except StopAsyncIteration:
                break
            if chunk:
                await out.write(chunk)  # raises once the client has gone
        await out.write_eof()
    except ConnectionError:  # aiohttp's ClientConnectionResetError is one
        log.debug("client of /%s left a streamed response", request.path)
    finally:
        if following is not None and not following.done():
            # Cancelled here (the listener cancels a handler whose client left) while the
            # producer ran: it must not go on alone, nor end later with nobody to see it.
            following.cancel()
            with contextlib.suppress(BaseException):
                await asyncio.wait([following])
        if following is not None and following.done() and not following.cancelled():
            following.exception()  # seen: an end (StopAsyncIteration) nobody read is no error
        close = getattr(response.stream, "aclose", None)
        if close is not None:
            with contextlib.suppress(Exception):
                await close()
    return out


def make_app(handler: Handler, limits: Limits | None = None, base_path: str = "/") -> web.Application:
    """An aiohttp application that hands every request under ``base_path`` to ``handler``."""
    limits = limits or Limits()
    base = "/" + base_path.strip("/") + "/" if base_path.strip("/") else "/"

    async def view(request: web.Request) -> web.StreamResponse:
        if not request.path.startswith(base):
            return to_aiohttp(http_problem(404, f"outside this instance's base path {base}"))
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return to_aiohttp(http_problem(413, f"request body over {limits.max_body} bytes"))
        transport = request.transport
        ours = Request(method=request.method, path=request.path[len(base):], query=dict(request.query),
                       body=body, headers={k.lower(): v for k, v in request.headers.items()},
                       peer=peer_of(transport.get_extra_info("ssl_object")) if transport else None)
        try:
            response = await handler(ours)
        except Exception:
            log.exception("handler failed: %s /%s from %s", ours.method, ours.path, ours.peer)
            response = http_problem(500, INTERNAL_ERROR_DETAIL)
        if response.stream is not None:
            return await stream_to_aiohttp(request, response)
        return to_aiohttp(response)

    app = web.Application(client_max_size=limits.max_body)
    app.router.add_route("*", "/{tail:.*}", view)
    return app


class Http1Server:
    def __init__(self, runner: web.AppRunner, site: web.TCPSite) -> None:
        self._runner = runner
        self._site = site

    @property
    def port(self) -> int:
        server = cast(asyncio.Server, self._site._server)
        return int(server.sockets[0].getsockname()[1])

    def close(self) -> None:
        pass  # aiohttp stops listening and closes connections in wait_closed (runner cleanup)

    async def wait_closed(self) -> None:
        await self._runner.cleanup()

    async def __aenter__(self) -> Http1Server:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.wait_closed()


async def serve_http1(handler: Handler, host: str, port: int, *, ssl: ssl_module.SSLContext | None,
                      insecure: bool = False, limits: Limits | None = None, base_path: str = "/") -> Http1Server:
    """Like :func:`~sdcp_fast.transport.h2server.serve`, over HTTP/1.1 (debugging only)."""
    if ssl is None:
        if not insecure:
            raise ValueError("serve_http1() needs an SSL context (mutual TLS) unless insecure=True")
        check_insecure(host, "HTTP/1.1 debugging server binding")
    log.warning("serving HTTP/1.1 (debugging transport; SDCP peers expect HTTP/2) on %s:%s", host, port)
    runner = web.AppRunner(make_app(handler, limits, base_path), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port, ssl_context=ssl)
    await site.start()
    return Http1Server(runner, site)


class Http1Transport:
    """A :class:`~sdcp_fast.transport.base.Transport` over HTTP/1.1 (aiohttp's pooled client)."""

    def __init__(self, ssl: ssl_module.SSLContext | None = None, *, insecure: bool = False,
                 timeout: float | None = 30.0, connections_per_host: int = 100) -> None:
        self.ssl = ssl
        self.insecure = insecure
        self.timeout = timeout
        self._limit = connections_per_host
        self._session: aiohttp.ClientSession | None = None

    async def request(self, base_uri: str, method: str, path: str, *, body: bytes = b"",
                      query: Mapping[str, str] | None = None, headers: Mapping[str, str] | None = None,
                      timeout: float | None = None) -> Response:
        url = self._url(base_uri, path)
        limit = timeout if timeout is not None else self.timeout
        try:
            async with self._client().request(method, url, data=body or None, params=query, headers=headers,
                                              timeout=aiohttp.ClientTimeout(total=limit)) as reply:
                data = await reply.read()
                return Response(reply.status, data, {k.lower(): v for k, v in reply.headers.items()})
        except asyncio.TimeoutError as exc:
            raise TransportTimeout(f"{method} {url}: no response within {limit} s") from exc
        except aiohttp.ClientError as exc:
            raise TransportError(f"{method} {url}: {exc}") from exc

    async def request_stream(self, base_uri: str, method: str, path: str, *, body: bytes = b"",
                             query: Mapping[str, str] | None = None, headers: Mapping[str, str] | None = None,
                             timeout: float | None = None) -> Response:
        """Like :meth:`request`, returning at the headers with the body in ``Response.stream``
        (as :meth:`H2Transport.request_stream`); ``timeout`` bounds the wait for the headers."""
        url = self._url(base_uri, path)
        limit = timeout if timeout is not None else self.timeout
        try:
            reply = await asyncio.wait_for(self._client().request(
                method, url, data=body or None, params=query, headers=headers,
                timeout=aiohttp.ClientTimeout(total=None, sock_read=None)), limit)
        except asyncio.TimeoutError as exc:
            raise TransportTimeout(f"{method} {url}: no response within {limit} s") from exc
        except aiohttp.ClientError as exc:
            raise TransportError(f"{method} {url}: {exc}") from exc
        return Response(reply.status, b"", {k.lower(): v for k, v in reply.headers.items()},
                        stream=_read_chunks(reply, f"{method} {url}"))

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(
                ssl=self.ssl if self.ssl is not None else False, limit_per_host=self._limit))
        return self._session

    def _url(self, base_uri: str, path: str) -> str:
        parts = urlsplit(base_uri)
        if parts.scheme == "http":
            if not self.insecure:
                raise TransportError(f"{base_uri}: plain http needs an insecure transport (--insecure)")
            try:
                check_insecure(parts.hostname or "", "HTTP/1.1 client connection to")
            except ValueError as exc:
                raise TransportError(str(exc)) from None
        return base_uri.rstrip("/") + "/" + quote(path.lstrip("/"), safe="/:@!$&'()*+,;=~")

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def __aenter__(self) -> Http1Transport:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


async def _read_chunks(reply: aiohttp.ClientResponse, what: str) -> AsyncIterator[bytes]:
    """A streamed reply's body as it arrives; leaving early closes the connection."""
    try:
        async for chunk in reply.content.iter_any():
            yield chunk
    except aiohttp.ClientError as exc:
        raise TransportError(f"{what}: {exc}") from exc
    finally:
        reply.close()
