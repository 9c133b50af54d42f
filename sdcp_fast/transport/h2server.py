"""Serve a :data:`~sdcp_fast.transport.base.Handler` over HTTP/2 with mutual TLS (§5.1).

Each connection is an :class:`~sdcp_fast.transport.h2conn.H2Protocol`; its peer is read
once from the verified client certificate and given to every request of the connection.
A request whose stream ends runs the handler in its own task (streams are concurrent);
the handler's exceptions become a 500 problem without a traceback, a body over the bound a
413 problem. A handler is not cancelled when its client goes away: SDCP handlers commit
state (a verdict is appended to the commit log before it is released), so they finish and
the response is dropped. A streamed response (``Response.stream``) is sent chunk by chunk
as the iterator yields, within the client's flow-control windows; when the client resets
the stream or the connection ends, the iterator is closed (``aclose``), so its producer
stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl as ssl_module
from urllib.parse import parse_qsl, unquote

import h2.events
import h2.exceptions
from h2.errors import ErrorCodes

from sdcp_fast.protocol.peer import Peer
from sdcp_fast.transport import nativeserver
from sdcp_fast.transport.base import Handler, Request, Response
from sdcp_fast.transport.binding import check_insecure
from sdcp_fast.transport.fields import header_dict, outbound_fields
from sdcp_fast.transport.h2conn import H2Protocol, Limits, StreamGone, ack
from sdcp_fast.transport.h2native import WholeMessage
from sdcp_fast.transport.nativeserver import NativeServer
from sdcp_fast.transport.problem import INTERNAL_ERROR_DETAIL, http_problem
from sdcp_fast.transport.tls import ServerContext, peer_of

log = logging.getLogger("sdcp_fast.transport")

_NO_BODY_STATUS = frozenset({204, 304})


class _Incoming:
    __slots__ = ("headers", "chunks", "size", "answered", "done", "pump", "timer")

    def __init__(self, headers: list[tuple[bytes, bytes]]) -> None:
        self.headers = headers
        self.chunks: list[bytes] = []
        self.size = 0
        self.answered = False  # a response was started (the handler runs, or we refused the body)
        self.done = False
        self.pump: asyncio.Task[None] | None = None  # sending a streamed response
        self.timer: asyncio.TimerHandle | None = None  # the request_timeout of an unfinished body


class _ServerProtocol(H2Protocol):
    def __init__(self, server: H2Server) -> None:
        super().__init__(server.limits)
        self.server = server
        self.peer: Peer | None = None
        self.streams: dict[int, _Incoming] = {}
        self.buffered = 0  # request-body bytes held for streams whose request has not ended

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        if self.transport is None or self.transport.is_closing():
            return
        self.peer = peer_of(self.transport.get_extra_info("ssl_object"))
        self.server.connections.add(self)
        self.server.accepted += 1
        if self.server.closing:
            self.close()

    def on_lost(self, exc: Exception | None) -> None:
        self.server.connections.discard(self)
        for incoming in list(self.streams.values()):
            if incoming.pump is not None:
                incoming.pump.cancel()
            if incoming.timer is not None:  # it would keep the stream's chunks alive until it fires
                incoming.timer.cancel()
                incoming.timer = None
            if not incoming.answered:
                self._drop_body(incoming)

    def on_event(self, event: h2.events.Event) -> None:
        if isinstance(event, WholeMessage):  # nghttp2: headers, body and end at once
            incoming = self._started(event.stream_id, event.headers, True)
            if incoming is not None and event.data:
                self._received(event.stream_id, incoming, event.data)
            self._ended(event.stream_id)
        elif isinstance(event, h2.events.DataReceived):
            ack(self.conn, event)
            incoming = self.streams.get(event.stream_id)
            if incoming is not None:
                self._received(event.stream_id, incoming, event.data)
        elif isinstance(event, h2.events.RequestReceived):
            self._started(event.stream_id, event.headers, event.stream_ended is not None)
        elif isinstance(event, h2.events.StreamEnded):
            self._ended(event.stream_id)
        elif isinstance(event, h2.events.StreamReset):
            incoming = self.streams.get(event.stream_id)
            if incoming is not None and incoming.pump is not None:
                incoming.pump.cancel()  # the client left a streamed response: stop producing
            elif incoming is not None and not incoming.answered:
                self._drop_body(incoming)
                self._finish(event.stream_id, incoming)
        elif isinstance(event, h2.events.ConnectionTerminated):
            if self.active_streams == 0:
                self._final_close()

    def _started(self, stream_id: int, headers: list[tuple[bytes, bytes]], ended: bool) -> _Incoming | None:
        """A request's headers: its stream is ours until answered (None: refused)."""
        if self.draining:
            # After our GOAWAY (RFC 9113 §6.8): not processed, safe for the client to retry.
            self.conn.reset_stream(stream_id, ErrorCodes.REFUSED_STREAM)
            return None
        incoming = _Incoming(headers)
        self.streams[stream_id] = incoming
        self.stream_started()
        length = next((v for k, v in headers if k == b"content-length"), None)
        if length is not None and length.isdigit() and int(length) > self.limits.max_body:
            self._refuse_body(stream_id, incoming)
        elif not ended and self.limits.request_timeout > 0:
            incoming.timer = self.loop.call_later(self.limits.request_timeout, self._too_slow, stream_id, incoming)
        return incoming

    def _received(self, stream_id: int, incoming: _Incoming, data: bytes) -> None:
        """Body bytes of a request (already returned to the client's windows): held within
        the body bounds, else the request is refused."""
        if incoming.answered:
            return
        incoming.size += len(data)
        if incoming.size > self.limits.max_body:
            self._refuse_body(stream_id, incoming)
        elif self.buffered + len(data) > max(self.limits.max_buffered, self.limits.max_body):
            # Bodies of all this connection's streams together: one stream over it is
            # refused, so many streams cannot each hold up to max_body.
            self._refuse_body(stream_id, incoming, 503, "request bodies on this connection over "
                              f"{max(self.limits.max_buffered, self.limits.max_body)} bytes")
        elif self.server.buffered + len(data) > max(self.limits.max_buffered_total, self.limits.max_body):
            # And of all connections: many connections cannot each hold max_buffered.
            self._refuse_body(stream_id, incoming, 503, "request bodies on this server over "
                              f"{max(self.limits.max_buffered_total, self.limits.max_body)} bytes")
        else:
            incoming.chunks.append(data)
            self._hold(len(data))

    def _ended(self, stream_id: int) -> None:
        incoming = self.streams.get(stream_id)
        if incoming is not None and not incoming.answered:
            incoming.answered = True
            self.loop.create_task(self._respond(stream_id, incoming))

    def _too_slow(self, stream_id: int, incoming: _Incoming) -> None:
        if incoming.answered or self.transport is None:
            return
        incoming.answered = True
        self._drop_body(incoming)
        self.loop.create_task(self._send(stream_id, incoming, http_problem(
            408, f"request body not complete within {self.limits.request_timeout:g} s"), stop_reading=True))

    def _finish(self, stream_id: int, incoming: _Incoming) -> None:
        if incoming.timer is not None:
            incoming.timer.cancel()
            incoming.timer = None
        if not incoming.done:
            incoming.done = True
            self.streams.pop(stream_id, None)
            self.stream_finished()

    def _hold(self, n: int) -> None:
        self.buffered += n
        self.server.buffered += n

    def _drop_body(self, incoming: _Incoming) -> None:
        self._hold(-sum(len(chunk) for chunk in incoming.chunks))
        incoming.chunks.clear()

    def _refuse_body(self, stream_id: int, incoming: _Incoming, status: int = 413, detail: str = "") -> None:
        incoming.answered = True
        self._drop_body(incoming)
        self.loop.create_task(self._send(stream_id, incoming, http_problem(
            status, detail or f"request body over {self.limits.max_body} bytes"), stop_reading=True))

    def _request(self, incoming: _Incoming) -> Request | Response:
        method = path = b""
        for name, value in incoming.headers:
            if name == b":method":
                method = value
            elif name == b":path":
                path = value
        raw_path, _, raw_query = path.decode("latin-1").partition("?")
        base = self.server.base_path
        if not raw_path.startswith(base):
            return http_problem(404, f"outside this instance's base path {base}")
        body = incoming.chunks[0] if len(incoming.chunks) == 1 else b"".join(incoming.chunks)
        self._hold(-len(body))  # handed to the handler: no longer this connection's buffer
        incoming.chunks = []
        return Request(method=method.decode("latin-1"), path=unquote(raw_path[len(base):]),
                       query=dict(parse_qsl(raw_query, keep_blank_values=True)) if raw_query else {},
                       body=body, headers=header_dict(incoming.headers), peer=self.peer)

    async def _respond(self, stream_id: int, incoming: _Incoming) -> None:
        request = self._request(incoming)
        if isinstance(request, Response):
            response = request
        else:
            try:
                response = await self.server.handler(request)
            except Exception:
                log.exception("handler failed: %s /%s from %s", request.method, request.path, self.peer)
                response = http_problem(500, INTERNAL_ERROR_DETAIL)
            except asyncio.CancelledError:
                # Cancelled (the server is shutting down, or the handler let a cancellation
                # out): no answer can be awaited now, so reset the stream and free it.
                if self.transport is not None:
                    try:
                        self.conn.reset_stream(stream_id, ErrorCodes.INTERNAL_ERROR)
                        self.flush_soon()
                    except h2.exceptions.ProtocolError:
                        pass
                self._finish(stream_id, incoming)
                raise
        await self._send(stream_id, incoming, response)

    async def _send(self, stream_id: int, incoming: _Incoming, response: Response,
                    stop_reading: bool = False) -> None:
        try:
            if self.transport is None:
                return
            if response.stream is not None and response.status not in _NO_BODY_STATUS:
                await self._send_stream(stream_id, incoming, response)
                return
            body = response.body if response.status not in _NO_BODY_STATUS else b""
            if not isinstance(body, (bytes, bytearray, memoryview)):
                # Nothing of it can be sent: the stream is reset, not left open for the client's
                # timeout (as on the native server).
                log.error("cannot answer stream %d from %s: a %s body", stream_id, self.peername,
                          type(body).__name__)
                with contextlib.suppress(h2.exceptions.ProtocolError):
                    self.conn.reset_stream(stream_id, ErrorCodes.INTERNAL_ERROR)
                    self.flush_soon()
                return
            fields = [(":status", str(response.status))]
            fields += [f for f in outbound_fields(dict(response.headers)) if f[0] != "content-length"]
            fields.append(("content-length", str(len(body))))
            try:
                if self.send_message(stream_id, fields, body):
                    self.flush_stream_end()
                else:
                    await self.send_body(stream_id, body)
                open_ = self.conn.streams.get(stream_id) if stop_reading else None  # h2's table, or nghttp2's
                if open_ is not None and not open_.closed:
                    # Answered before the request ended: ask the client to stop sending
                    # without error (RFC 9113 §8.1).
                    self.conn.reset_stream(stream_id, ErrorCodes.NO_ERROR)
                    self.flush_soon()
            except (StreamGone, h2.exceptions.StreamClosedError):
                pass  # the client reset the stream or left: nobody to answer
            except h2.exceptions.ProtocolError as exc:
                log.warning("cannot answer stream %d from %s: %s", stream_id, self.peername, exc)
        finally:
            if response.stream is not None and incoming.pump is None:
                await _close_stream(response)  # not sent (no body allowed, or no connection)
            self._finish(stream_id, incoming)

    async def _send_stream(self, stream_id: int, incoming: _Incoming, response: Response) -> None:
        """Headers without a length, then each chunk as the iterator yields it. The pump is a
        task of its own so that a reset or a lost connection can stop it while it waits for
        the producer's next chunk."""
        assert response.stream is not None
        fields = [(":status", str(response.status))]
        fields += [f for f in outbound_fields(dict(response.headers)) if f[0] != "content-length"]

        async def pump() -> None:
            assert response.stream is not None
            self.conn.send_headers(stream_id, fields)
            self.flush()
            async for chunk in response.stream:
                if chunk:
                    await self.send_chunk(stream_id, chunk)
            self.end_stream(stream_id)

        incoming.pump = self.loop.create_task(pump())
        try:
            await asyncio.wait([incoming.pump])
        finally:
            if not incoming.pump.done():  # we were cancelled (shutdown): stop the pump too
                incoming.pump.cancel()
                await asyncio.wait([incoming.pump])
            await _close_stream(response)
        if incoming.pump.cancelled():
            return
        exc = incoming.pump.exception()
        if isinstance(exc, (StreamGone, h2.exceptions.StreamClosedError)):
            return
        if exc is not None:
            log.error("streamed response on stream %d failed: %r", stream_id, exc, exc_info=exc)
            with contextlib.suppress(h2.exceptions.ProtocolError):
                if self.transport is not None:
                    self.conn.reset_stream(stream_id, ErrorCodes.INTERNAL_ERROR)
                    self.flush_soon()


async def _close_stream(response: Response) -> None:
    close = getattr(response.stream, "aclose", None)
    if close is not None:
        with contextlib.suppress(Exception):
            await close()


class H2Server:
    """A listening HTTP/2 server; :func:`serve` makes one."""

    def __init__(self, handler: Handler, limits: Limits, base_path: str) -> None:
        self.handler = handler
        self.limits = limits
        self.base_path = "/" + base_path.strip("/") + "/" if base_path.strip("/") else "/"
        self.connections: set[_ServerProtocol] = set()
        self.closing = False
        self.accepted = 0  # connections that completed TLS (with a verified client) and chose h2
        self.buffered = 0  # request-body bytes held by all connections for requests not ended
        self._server: asyncio.Server | None = None

    @property
    def port(self) -> int:
        assert self._server is not None and self._server.sockets
        return int(self._server.sockets[0].getsockname()[1])

    def close(self) -> None:
        """Stop accepting; GOAWAY every connection (each closes when its streams are done)."""
        self.closing = True
        if self._server is not None:
            self._server.close()
        for connection in list(self.connections):
            connection.close()

    async def wait_closed(self, grace: float = 5.0) -> None:
        """Wait for the connections to finish their streams, at most ``grace`` seconds."""
        pending = [c.closed for c in self.connections]
        if pending:
            await asyncio.wait(pending, timeout=grace)
        for connection in list(self.connections):
            if connection.transport is not None:
                connection.transport.abort()
        if self._server is not None:
            await self._server.wait_closed()

    async def __aenter__(self) -> H2Server:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()
        await self.wait_closed()


async def serve(handler: Handler, host: str, port: int, *, ssl: ssl_module.SSLContext | None,
                insecure: bool = False, limits: Limits | None = None, base_path: str = "/",
                handshake_timeout: float = 10.0) -> H2Server | NativeServer:
    """Listen on ``host:port`` (0: any free port, see ``.port``) and serve ``handler``.

    ``ssl`` is a :func:`~sdcp_fast.transport.tls.server_context`; without it ``insecure``
    must be set, and then only a loopback ``host`` is accepted (h2c with prior knowledge).
    ``base_path`` is the path of the instance's base URI; request paths are given relative
    to it. The server is the native one where it is built (:mod:`~sdcp_fast.transport.nativeserver`,
    ``SDCP_SERVER``), else this module's: the same behaviour either way."""
    if ssl is None:
        if not insecure:
            raise ValueError("serve() needs an SSL context (mutual TLS) unless insecure=True")
        check_insecure(host, "HTTP/2 server binding")
    if nativeserver.serves(ssl):
        return await nativeserver.serve(handler, host, port, ssl=ssl if isinstance(ssl, ServerContext) else None,
                                        limits=limits or Limits(), base_path=base_path,
                                        handshake_timeout=handshake_timeout)
    server = H2Server(handler, limits or Limits(), base_path)
    loop = asyncio.get_running_loop()
    server._server = await loop.create_server(
        lambda: _ServerProtocol(server), host, port, ssl=ssl,
        ssl_handshake_timeout=handshake_timeout if ssl is not None else None)
    return server
