"""The HTTP/2 client :class:`H2Transport`: one connection per authority, many streams on it.

Requests to the same ``scheme://host:port`` share one connection (opened on first use,
concurrent first requests wait for the same handshake); each is a stream, at most as many
at once as the server's SETTINGS_MAX_CONCURRENT_STREAMS, the rest wait for a free one. A
request the server provably did not process (stream refused, or above the last stream id
of a GOAWAY, e.g. an idle close racing the request) is sent once more on a new connection.
Anything else that leaves no response raises :class:`TransportError`.

:meth:`H2Transport.request_stream` returns once the response's headers arrive, with the
body as an async iterator of chunks (``Response.stream``); received data is returned to the
server's flow-control window only as the caller reads it, so a slow reader slows the server
instead of filling memory. Closing the iterator early resets the stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl as ssl_module
from collections import deque
from collections.abc import AsyncIterator, Coroutine, Mapping
from typing import Any
from urllib.parse import quote, urlsplit

import h2.events
import h2.exceptions
from h2.errors import ErrorCodes

from sdcp_fast.transport.base import Response
from sdcp_fast.transport.binding import check_insecure
from sdcp_fast.transport.errors import TransportError, TransportTimeout
from sdcp_fast.transport.fields import NOT_SENT, query_string, response_fields
from sdcp_fast.transport.h2conn import H2Protocol, Limits, StreamGone, ack
from sdcp_fast.transport.h2native import WholeMessage

CLIENT_LIMITS = Limits(max_body=256 * (1 << 20), idle_timeout=60.0)


class _Pending:
    __slots__ = ("future", "status", "headers", "chunks", "size", "queue", "acked", "stream_id", "deadline",
                 "shape", "limit", "over")

    def __init__(self, future: asyncio.Future[Response], stream_id: int, streamed: bool = False) -> None:
        self.future = future
        self.stream_id = stream_id
        self.status = 0
        self.headers: dict[str, str] = {}
        self.chunks: list[bytes] = []
        self.size = 0
        # Streamed: DATA frames, then None at the end or the error that ended the stream.
        self.queue: asyncio.Queue[bytes | TransportError | None] | None = asyncio.Queue() if streamed else None
        self.acked = 0  # streamed bytes queued that were returned to the server's windows on arrival
        self.deadline = 0.0  # loop time by which the response (its headers, if streamed) is due
        self.shape: _Shape | None = None  # names the request in a timeout's message
        self.limit = 0.0
        self.over = False  # the exchange has ended


class _Shape:
    """What a request to one base URI, method and path always sends: built once per shape."""

    __slots__ = ("key", "head", "target", "what", "headers", "tail")

    def __init__(self, key: tuple[str, str, int], head: list[tuple[str, str]], target: str, what: str) -> None:
        self.key = key  # (scheme, host, port): the connection
        self.head = head  # :method, :scheme, :authority
        self.target = target  # :path without the query
        self.what = what  # "METHOD base-uri path", for errors
        # The caller's headers last sent with this shape and the fields they make: a client
        # sends the same few (content-type) with every request to a resource.
        self.headers: dict[str, str] | None = None
        self.tail: list[tuple[str, str]] = []

    def fields(self, headers: Mapping[str, str] | None) -> list[tuple[str, str]]:
        """The fields sent for the caller's ``headers`` (those it may set, names lower-case)."""
        if not headers:
            return []
        if headers == self.headers:
            return self.tail
        tail = []
        for name, value in headers.items():
            name = name.lower()
            if name not in NOT_SENT:
                tail.append((name, value))
        self.headers, self.tail = dict(headers), tail
        return tail


def _timeout(shape: _Shape | None, limit: float) -> TransportTimeout:
    return TransportTimeout(f"{shape.what if shape else 'request'}: no response within {limit} s")


class _ClientProtocol(H2Protocol):
    client_side = True

    def __init__(self, limits: Limits) -> None:
        super().__init__(limits)
        self.pending: dict[int, _Pending] = {}
        self._slot_waiters: deque[asyncio.Future[None]] = deque()
        self.lost: Exception | None = None
        # Requests' deadlines without a timer each: per time limit, the exchanges in the order
        # they started (so in deadline order), and one timer at the earliest deadline due.
        self._deadlines: dict[float, deque[_Pending]] = {}
        self._deadline_timer: asyncio.TimerHandle | None = None
        self._deadline_at = 0.0
        self._peer_streams = self.conn.remote_settings.max_concurrent_streams  # kept at each SETTINGS

    @property
    def usable(self) -> bool:
        return self.transport is not None and not self.transport.is_closing() and not self.peer_goaway \
            and not self.draining

    def _fail(self, stream_id: int, error: TransportError) -> None:
        pending = self.pending.pop(stream_id, None)
        if pending is not None and not pending.future.done():
            pending.future.set_exception(error)
        elif pending is not None and pending.queue is not None:
            pending.queue.put_nowait(error)

    def on_event(self, event: h2.events.Event) -> None:
        if isinstance(event, WholeMessage):  # nghttp2: headers, body and end at once
            pending = self.pending.get(event.stream_id)
            if pending is not None and pending.queue is None and not pending.future.done() \
                    and len(event.data) <= self.limits.max_body:
                # The common answer, what _headers, _received and _ended would make of it.
                del self.pending[event.stream_id]
                status, headers = response_fields(event.headers)
                pending.future.set_result(Response(status, event.data, headers))
                return
            if pending is not None:
                self._headers(pending, event.headers)
                if event.data:
                    self._received(event.stream_id, pending, event.data)
            self._ended(event.stream_id)
        elif isinstance(event, h2.events.DataReceived):
            pending = self.pending.get(event.stream_id)
            if pending is not None and pending.queue is not None and pending.future.done():
                # Acknowledged when read (the reader's pace sets the server's).
                if event.data:
                    pending.queue.put_nowait(event.data)
                padding = (event.flow_controlled_length or 0) - len(event.data)
                if padding > 0:
                    with contextlib.suppress(h2.exceptions.StreamClosedError):
                        self.conn.acknowledge_received_data(padding, event.stream_id)
                return
            ack(self.conn, event)
            if pending is not None:
                self._received(event.stream_id, pending, event.data)
        elif isinstance(event, h2.events.ResponseReceived):
            pending = self.pending.get(event.stream_id)
            if pending is not None:
                self._headers(pending, event.headers)
        elif isinstance(event, h2.events.StreamEnded):
            self._ended(event.stream_id)
        elif isinstance(event, h2.events.StreamReset):
            code = ErrorCodes(event.error_code) if event.error_code in ErrorCodes._value2member_map_ \
                else event.error_code
            self._fail(event.stream_id, TransportError(
                f"stream reset by the server ({getattr(code, 'name', code)})",
                retryable=event.error_code == ErrorCodes.REFUSED_STREAM))
        elif isinstance(event, h2.events.ConnectionTerminated):
            last = event.last_stream_id if event.last_stream_id is not None else 0
            for stream_id in [s for s in self.pending if s > last]:
                self._fail(stream_id, TransportError("the server closed the connection before this request "
                                                     "(GOAWAY)", retryable=True))
            self._wake_slots(all_=True)
            if not self.pending:
                self._final_close()
        elif isinstance(event, h2.events.RemoteSettingsChanged):
            self._peer_streams = self.conn.remote_settings.max_concurrent_streams
            self._wake_slots(all_=True)

    def _headers(self, pending: _Pending, headers: list[tuple[bytes, bytes]]) -> None:
        pending.status, pending.headers = response_fields(headers)
        if pending.queue is not None and not pending.future.done() and pending.status >= 200:
            pending.future.set_result(Response(pending.status, b"", pending.headers))

    def _received(self, stream_id: int, pending: _Pending, data: bytes) -> None:
        """Body bytes already returned to the server's windows."""
        if pending.queue is not None and pending.future.done():
            pending.queue.put_nowait(data)  # streamed
            pending.acked += len(data)
            return
        pending.size += len(data)
        if pending.size > self.limits.max_body:
            self._fail(stream_id, TransportError(f"response body over {self.limits.max_body} bytes"))
            self._reset(stream_id, ErrorCodes.CANCEL)
        else:
            pending.chunks.append(data)

    def _ended(self, stream_id: int) -> None:
        pending = self.pending.pop(stream_id, None)
        if pending is not None and pending.queue is not None and pending.future.done():
            pending.queue.put_nowait(None)
        elif pending is not None and not pending.future.done():
            chunks = pending.chunks
            body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
            pending.future.set_result(Response(pending.status, body, pending.headers))

    def on_lost(self, exc: Exception | None) -> None:
        self.lost = exc
        if self._deadline_timer is not None:
            self._deadline_timer.cancel()
            self._deadline_timer = None
        self._deadlines.clear()
        reason = f": {exc}" if exc else ""
        for stream_id in list(self.pending):
            self._fail(stream_id, TransportError(f"connection closed before the response{reason}"))
        self._wake_slots(all_=True)

    def _reset(self, stream_id: int, code: ErrorCodes) -> None:
        try:
            self.conn.reset_stream(stream_id, code)
            self.flush_soon()
        except h2.exceptions.ProtocolError:
            pass  # already closed

    def _wake_slots(self, all_: bool = False) -> None:
        while self._slot_waiters:
            waiter = self._slot_waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                if not all_:
                    return

    # -- deadlines -------------------------------------------------------------------------
    def _watch(self, pending: _Pending) -> None:
        """Fail ``pending`` with a timeout at its deadline unless its response (headers, if
        streamed) came first."""
        queue = self._deadlines.get(pending.limit)
        if queue is None:
            queue = self._deadlines[pending.limit] = deque()
        else:
            while queue and (queue[0].over or queue[0].future.done()):
                queue.popleft()
        queue.append(pending)
        if self._deadline_timer is None or pending.deadline < self._deadline_at:
            self._arm(pending.deadline)

    def _arm(self, at: float) -> None:
        if self._deadline_timer is not None:
            self._deadline_timer.cancel()
        self._deadline_at = at
        self._deadline_timer = self.loop.call_at(at, self._expire)

    def _expire(self) -> None:
        self._deadline_timer = None
        now = self.loop.time()
        earliest: float | None = None
        for limit, queue in list(self._deadlines.items()):
            while queue:
                head = queue[0]
                if not (head.over or head.future.done()):
                    if head.deadline > now:
                        break
                    self._time_out(head)
                queue.popleft()
            if queue:
                earliest = queue[0].deadline if earliest is None else min(earliest, queue[0].deadline)
            else:
                del self._deadlines[limit]
        if earliest is not None:
            self._arm(earliest)

    def _time_out(self, pending: _Pending) -> None:
        self._fail(pending.stream_id, _timeout(pending.shape, pending.limit))
        if self.transport is not None:
            self._reset(pending.stream_id, ErrorCodes.CANCEL)
        # A body still being sent waits for a window or the socket: it stops when woken.
        self._wake_windows(pending.stream_id)
        self._wake_writers()

    def _wake_writers(self) -> None:
        waiters, self._write_waiters = self._write_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    # -- requests ----------------------------------------------------------------------------
    @property
    def has_stream(self) -> bool:
        """A new stream may start now."""
        return self.active_streams < self._peer_streams

    async def wait_stream(self) -> None:
        """Until a new stream may start (retryable :class:`TransportError` if the connection
        ends meanwhile)."""
        while not self.has_stream:
            waiter = self.loop.create_future()
            self._slot_waiters.append(waiter)
            await waiter
            if not self.usable:
                raise TransportError("connection closed while waiting for a stream", retryable=True)

    async def exchange(self, fields: list[tuple[str, str]], body: bytes, streamed: bool = False,
                       deadline: float | None = None, shape: _Shape | None = None, limit: float = 0.0) -> Response:
        """One request on a new stream; ``deadline`` (loop time) bounds the wait for the
        response (its headers, if ``streamed``): then :class:`TransportTimeout`."""
        if not self.has_stream:
            await self.wait_stream()
        if not self.usable:
            raise TransportError("connection closed", retryable=True)
        return await self.exchange_now(fields, body, streamed, deadline, shape, limit)

    async def exchange_now(self, fields: list[tuple[str, str]], body: bytes, streamed: bool = False,
                           deadline: float | None = None, shape: _Shape | None = None,
                           limit: float = 0.0) -> Response:
        """:meth:`exchange` where the caller saw the connection usable and a stream free."""
        stream_id = self.conn.get_next_available_stream_id()
        pending = _Pending(self.loop.create_future(), stream_id, streamed)
        self.pending[stream_id] = pending
        if deadline is not None:
            pending.deadline, pending.shape, pending.limit = deadline, shape, limit
            self._watch(pending)
        self.stream_started()
        handed_off = False
        try:
            if self.send_message(stream_id, fields, body):
                self.flush_stream_end()
            else:
                try:
                    # A streamed response's future is done at its headers, not at its end.
                    await self.send_body(stream_id, body, abandon=pending.future, failed_only=streamed)
                except StreamGone:
                    # Reset, or answered early (e.g. 413): the future says which.
                    if not pending.future.done():
                        self._fail(stream_id, TransportError("stream closed while sending the request"))
            response = await pending.future
            if pending.queue is None:
                return response
            handed_off = True
            return Response(response.status, b"", response.headers,
                            stream=self._chunks(stream_id, pending))
        except (h2.exceptions.ProtocolError, h2.exceptions.StreamClosedError) as exc:
            raise TransportError(f"cannot send on this connection: {exc}", retryable=True) from exc
        except asyncio.CancelledError:
            if not pending.future.done():
                self._reset(stream_id, ErrorCodes.CANCEL)
            raise
        finally:
            if not handed_off:
                self._end_exchange(stream_id, pending)

    def _end_exchange(self, stream_id: int, pending: _Pending) -> None:
        pending.over = True
        pending.chunks = []  # a deadline queue may hold the exchange until its deadline
        self.pending.pop(stream_id, None)
        if not pending.future.done():
            pending.future.cancel()
        self.stream_finished()
        self._wake_slots()

    async def _chunks(self, stream_id: int, pending: _Pending) -> AsyncIterator[bytes]:
        """A streamed response's body; leaving it before the end resets the stream."""
        assert pending.queue is not None
        ended = False
        try:
            while True:
                item = await pending.queue.get()
                if item is None:
                    ended = True
                    return
                if isinstance(item, TransportError):
                    ended = True
                    raise item
                unacked = len(item) - min(len(item), pending.acked)
                pending.acked -= len(item) - unacked
                if unacked and self.transport is not None:
                    try:
                        self.conn.acknowledge_received_data(unacked, stream_id)
                        self.flush_soon()
                    except (h2.exceptions.StreamClosedError, h2.exceptions.ProtocolError):
                        pass
                pending.size += len(item)
                yield item
        finally:
            if not ended and self.transport is not None:
                self._reset(stream_id, ErrorCodes.CANCEL)
            self._end_exchange(stream_id, pending)


class H2Transport:
    """:class:`~sdcp_fast.transport.base.Transport` over HTTP/2.

    ``ssl`` is a :func:`~sdcp_fast.transport.tls.client_context` (our certificate, the CA,
    ALPN h2) for ``https://`` base URIs; ``http://`` ones (h2c prior knowledge) are refused
    unless ``insecure`` is set, and then only to loopback hosts. ``timeout`` bounds a whole
    request (connect, send, response) unless the request gives its own."""

    def __init__(self, ssl: ssl_module.SSLContext | None = None, *, insecure: bool = False,
                 timeout: float | None = 30.0, connect_timeout: float = 10.0,
                 limits: Limits = CLIENT_LIMITS) -> None:
        self.ssl = ssl
        self.insecure = insecure
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.limits = limits
        self._connections: dict[tuple[str, str, int], _ClientProtocol] = {}
        self._connecting: dict[tuple[str, str, int], asyncio.Future[_ClientProtocol]] = {}
        self._bases: dict[str, tuple[tuple[str, str, int], str, str]] = {}
        self._shapes: dict[tuple[str, str, str], _Shape] = {}
        self._closed = False

    def _base(self, base_uri: str) -> tuple[tuple[str, str, int], str, str]:
        known = self._bases.get(base_uri)
        if known is None:
            parts = urlsplit(base_uri)
            if parts.scheme not in ("https", "http") or not parts.hostname:
                raise TransportError(f"not an http(s) base URI: {base_uri!r}")
            if parts.scheme == "http":
                if not self.insecure:
                    raise TransportError(f"{base_uri}: plain http needs an insecure transport (--insecure)")
                try:
                    check_insecure(parts.hostname, "HTTP/2 client connection to")
                except ValueError as exc:
                    raise TransportError(str(exc)) from None
            elif self.ssl is None:
                raise TransportError(f"{base_uri}: https needs an SSL context")
            port = parts.port or (443 if parts.scheme == "https" else 80)
            base_path = "/" + parts.path.strip("/") + "/" if parts.path.strip("/") else "/"
            known = ((parts.scheme, parts.hostname, port), parts.netloc, base_path)
            self._bases[base_uri] = known
        return known

    @property
    def connections(self) -> int:
        """Connections open now."""
        return len(self._connections)

    # Plain methods returning the request's coroutine: awaited as the interface's coroutine
    # methods are, one coroutine fewer per request.
    def request(self, base_uri: str, method: str, path: str, *, body: bytes = b"",
                query: Mapping[str, str] | None = None, headers: Mapping[str, str] | None = None,
                timeout: float | None = None) -> Coroutine[Any, Any, Response]:
        return self._request(base_uri, method, path, body, query, headers, timeout, False)

    def request_stream(self, base_uri: str, method: str, path: str, *, body: bytes = b"",
                       query: Mapping[str, str] | None = None, headers: Mapping[str, str] | None = None,
                       timeout: float | None = None) -> Coroutine[Any, Any, Response]:
        """Like :meth:`request`, returning at the response's headers with the body in
        ``Response.stream`` (read it to the end or ``aclose`` it; either frees the stream).
        ``timeout`` bounds the wait for the headers only: a stream may last."""
        return self._request(base_uri, method, path, body, query, headers, timeout, True)

    def _shape(self, base_uri: str, method: str, path: str) -> _Shape:
        key, authority, base_path = self._base(base_uri)
        shape = _Shape(key, [(":method", method), (":scheme", key[0]), (":authority", authority)],
                       base_path + quote(path.lstrip("/"), safe="/:@!$&'()*+,;=~"), f"{method} {base_uri}{path}")
        if len(self._shapes) >= 4096:  # e.g. a path per session: keep the recent ones
            self._shapes.clear()
        self._shapes[base_uri, method, path] = shape
        return shape

    async def _request(self, base_uri: str, method: str, path: str, body: bytes,
                       query: Mapping[str, str] | None, headers: Mapping[str, str] | None,
                       timeout: float | None, streamed: bool) -> Response:
        if self._closed:
            raise TransportError("transport is closed")
        shape = self._shapes.get((base_uri, method, path)) or self._shape(base_uri, method, path)
        target = shape.target + "?" + query_string(query) if query else shape.target
        if body:
            fields = [*shape.head, (":path", target), ("content-length", str(len(body))), *shape.fields(headers)]
        else:
            fields = [*shape.head, (":path", target), *shape.fields(headers)]
        limit = timeout if timeout is not None else self.timeout
        key = shape.key
        for attempt in (1, 2):
            connection = self._connections.get(key)
            try:
                if limit is None:
                    if connection is None or not connection.usable:
                        connection = await self._connection(key)
                    return await connection.exchange(fields, body, streamed)
                if connection is not None and connection.usable and connection.has_stream:
                    # The common case: the exchange times out on its own (no task to cancel).
                    if attempt == 1:
                        deadline = connection.loop.time() + limit
                    elif connection.loop.time() >= deadline:
                        raise _timeout(shape, limit)
                    return await connection.exchange_now(fields, body, streamed, deadline, shape, limit)
                if attempt == 1:
                    deadline = asyncio.get_running_loop().time() + limit
                return await self._connect_and_send(key, fields, body, streamed, deadline, shape, limit)
            except TransportError as exc:
                if not exc.retryable or attempt == 2:
                    raise
        raise AssertionError("unreachable")

    async def _connect_and_send(self, key: tuple[str, str, int], fields: list[tuple[str, str]], body: bytes,
                                streamed: bool, deadline: float, shape: _Shape, limit: float) -> Response:
        """Connect (or wait for a stream) and send, all before ``deadline``: this part may
        wait on anything, so the task is cancelled when it passes."""
        task = asyncio.current_task()
        assert task is not None
        expired = False

        def expire() -> None:
            nonlocal expired
            expired = True
            task.cancel()

        timer = asyncio.get_running_loop().call_at(deadline, expire)
        try:
            connection = await self._connection(key)
            return await connection.exchange(fields, body, streamed)
        except asyncio.CancelledError:
            if not expired:
                raise
            if hasattr(task, "uncancel"):
                task.uncancel()
            raise _timeout(shape, limit) from None
        finally:
            timer.cancel()

    async def _connection(self, key: tuple[str, str, int]) -> _ClientProtocol:
        connection = self._connections.get(key)
        if connection is not None and connection.usable:
            return connection
        waiting = self._connecting.get(key)
        if waiting is not None:
            return await asyncio.shield(waiting)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[_ClientProtocol] = loop.create_future()
        self._connecting[key] = future
        scheme, host, port = key
        try:
            ctx = self.ssl if scheme == "https" else None
            _, fresh = await asyncio.wait_for(loop.create_connection(
                lambda: _ClientProtocol(self.limits), host, port, ssl=ctx,
                server_hostname=host if ctx is not None else None), self.connect_timeout)
            if not fresh.usable:
                raise TransportError(f"{host}:{port} did not negotiate HTTP/2 (ALPN h2)")
            self._connections[key] = fresh
            future.set_result(fresh)
            return fresh
        except BaseException as exc:
            error = transport_error_for(host, port, exc)
            future.set_exception(error)
            future.exception()  # retrieved: other waiters may not exist
            if isinstance(exc, Exception):
                raise error from exc
            raise
        finally:
            del self._connecting[key]

    async def close(self) -> None:
        self._closed = True
        connections = list(self._connections.values())
        self._connections.clear()
        for connection in connections:
            connection.close()
        closing = [c.closed for c in connections if not c.closed.done()]
        if closing:
            await asyncio.wait(closing, timeout=5.0)
        for connection in connections:
            if connection.transport is not None:
                connection.transport.abort()

    async def __aenter__(self) -> H2Transport:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def transport_error_for(host: str, port: int, exc: BaseException) -> TransportError:
    if isinstance(exc, TransportError):
        return exc
    if isinstance(exc, asyncio.TimeoutError):
        return TransportTimeout(f"cannot connect to {host}:{port}: no TLS/TCP connection within the timeout")
    if isinstance(exc, asyncio.CancelledError):
        return TransportError(f"connecting to {host}:{port} was cancelled", retryable=True)
    return TransportError(f"cannot connect to {host}:{port}: {exc}")
