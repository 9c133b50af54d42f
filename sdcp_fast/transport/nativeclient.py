"""The HTTP/2 client's native path: sockets, TLS 1.3 and HTTP/2 framing in one C++ thread.

``sdcp_fast._nio.Client`` (``csrc/native_io/client.cpp``) owns the connections: it connects,
runs the handshake (our certificate; the server's checked against the CA and the host asked
for; ALPN h2), frames and encrypts the requests queued from here, and collects each response
whole. Finished requests wake this loop through one eventfd and are taken all at once; a
request costs Python one call to queue it and one future. :class:`NativeH2Transport` is an
:class:`~sdcp_fast.transport.h2client.H2Transport`: the same base URIs, fields, limits, timeouts
and errors, a stream refused before it was processed (REFUSED_STREAM, or above a GOAWAY's last
stream id) sent once more. Streamed responses (``request_stream``) take the pure-Python path.

Which client :func:`h2_client` builds (:func:`implementation`), as the server is chosen:
``SDCP_CLIENT=py`` the pure-Python one, ``SDCP_CLIENT=native`` this one (an error when it is not
built), unset: this one where ``_nio`` is built, else the pure-Python one
(``SDCP_REQUIRE_NATIVE_H2=1`` makes that an error). It speaks TLS from a
:func:`~sdcp_fast.transport.tls.client_context` (whose files it reads again) or h2c on
loopback; any other context keeps Python's TLS. A host name is resolved on the client's
thread when a connection opens (the roles' peers are addresses or names in /etc/hosts).
"""

from __future__ import annotations

import asyncio
import os
import ssl as ssl_module
import weakref
from collections import deque
from collections.abc import Coroutine, Mapping
from typing import Any

from sdcp_fast.transport.base import Response
from sdcp_fast.transport.errors import TransportError, TransportTimeout
from sdcp_fast.transport.fields import query_string
from sdcp_fast.transport.h2client import CLIENT_LIMITS, H2Transport, _Shape
from sdcp_fast.transport.h2conn import Limits
from sdcp_fast.transport.nativeserver import _load
from sdcp_fast.transport.tls import ClientContext

PY, NATIVE = "py", "native"

# How a request ended without a response (csrc/native_io/client.cpp, enum Failure).
_ANSWERED, _CONNECT, _REFUSED, _LOST, _RESET, _TOO_LARGE, _TIMEOUT, _CLOSED = range(8)


_chosen: str | None = None  # tests pin one client (use()); None: from the environment


def use(name: str | None) -> None:
    """Pin the client :func:`h2_client` builds (``py``, ``native``, None: from the environment)."""
    global _chosen
    if name not in (None, PY, NATIVE):
        raise ValueError(f"unknown client {name!r}")
    _chosen = name


def implementation() -> str:
    """``native`` or ``py``: what :func:`h2_client` builds now."""
    wanted = _chosen or os.environ.get("SDCP_CLIENT", "").strip().lower()
    if wanted in ("py", "python"):
        return PY
    if wanted not in ("", NATIVE, "c"):
        raise ValueError(f"SDCP_CLIENT={wanted!r}: expected py or native")
    if _load()[0] is not None:
        return NATIVE
    if wanted or os.environ.get("SDCP_REQUIRE_NATIVE_H2") == "1":
        raise ImportError(_load()[1])
    return PY


def speaks(ssl: ssl_module.SSLContext | None) -> bool:
    """Whether the native client can speak ``ssl`` (None: h2c): a
    :func:`~sdcp_fast.transport.tls.client_context` still requiring TLS 1.3, a verified server
    certificate and its name."""
    if ssl is None:
        return True
    return (isinstance(ssl, ClientContext) and ssl.minimum_version == ssl_module.TLSVersion.TLSv1_3
            and ssl.verify_mode == ssl_module.CERT_REQUIRED and ssl.check_hostname)


def h2_client(ssl: ssl_module.SSLContext | None = None, *, insecure: bool = False, timeout: float | None = 30.0,
              limits: Limits = CLIENT_LIMITS) -> H2Transport:
    """The HTTP/2 client :func:`implementation` chooses, where it can speak ``ssl``."""
    if implementation() == NATIVE and speaks(ssl):
        return NativeH2Transport(ssl, insecure=insecure, timeout=timeout, limits=limits)
    return H2Transport(ssl, insecure=insecure, timeout=timeout, limits=limits)


class NativeH2Transport(H2Transport):
    """:class:`~sdcp_fast.transport.h2client.H2Transport` whose whole-body requests go through
    the native client thread (see the module's notes)."""

    def __init__(self, ssl: ssl_module.SSLContext | None = None, *, insecure: bool = False,
                 timeout: float | None = 30.0, connect_timeout: float = 10.0,
                 limits: Limits = CLIENT_LIMITS) -> None:
        super().__init__(ssl, insecure=insecure, timeout=timeout, connect_timeout=connect_timeout, limits=limits)
        if not speaks(ssl):
            raise ValueError("the native client speaks TLS from a client_context (or h2c) only")
        mod = _load()[0]
        if mod is None:
            raise ImportError(_load()[1])
        cert, key, ca = ssl.files if isinstance(ssl, ClientContext) else (None, None, None)
        self._client = mod.Client(cert, key, ca, max_body=limits.max_body, max_frame=limits.max_frame,
                                  stream_window=limits.stream_window, connection_window=limits.connection_window,
                                  connect_timeout=connect_timeout, idle_timeout=limits.idle_timeout)
        self._waiting: dict[int, tuple[asyncio.Future[Response], _Shape]] = {}
        self._next_id = 0
        self._reader: asyncio.AbstractEventLoop | None = None
        # Requests queued in this loop iteration, handed to the thread in one call at its end.
        self._batch: list[tuple[int, str, int, bool, list[tuple[str, str]], bytes]] = []
        # Deadlines without a timer each (as the pure-Python client keeps them): per time
        # limit, the requests in the order they were sent, so in deadline order, and one timer
        # at the earliest deadline due.
        self._deadlines: dict[float, deque[tuple[float, int]]] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        weakref.finalize(self, self._client.stop)

    @property
    def connections(self) -> int:
        return int(self._client.connections)

    def request(self, base_uri: str, method: str, path: str, *, body: bytes = b"",
                query: Mapping[str, str] | None = None, headers: Mapping[str, str] | None = None,
                timeout: float | None = None) -> Coroutine[Any, Any, Response]:
        return self._native(base_uri, method, path, body, query, headers, timeout)

    async def _native(self, base_uri: str, method: str, path: str, body: bytes,
                      query: Mapping[str, str] | None, headers: Mapping[str, str] | None,
                      timeout: float | None) -> Response:
        if self._closed:
            raise TransportError("transport is closed")
        shape = self._shapes.get((base_uri, method, path)) or self._shape(base_uri, method, path)
        target = shape.target + "?" + query_string(query) if query else shape.target
        fields = [*shape.head, (":path", target)]
        if body:
            fields.append(("content-length", str(len(body))))
        fields += shape.fields(headers)
        scheme, host, port = shape.key
        limit = timeout if timeout is not None else self.timeout
        loop = asyncio.get_running_loop()
        if self._reader is not loop:
            self._watch(loop)
        deadline = None if limit is None else loop.time() + limit
        for attempt in (1, 2):
            self._next_id += 1
            rid = self._next_id
            future: asyncio.Future[Response] = loop.create_future()
            self._waiting[rid] = (future, shape)
            if not self._batch:
                loop.call_soon(self._send)
            self._batch.append((rid, host, port, scheme == "https", fields, body))
            if deadline is not None:
                self._watch_deadline(loop, limit or 0.0, deadline, rid)
            try:
                return await future
            except TransportError as exc:  # the native side's; a TransportTimeout is one too
                if not exc.retryable or attempt == 2:
                    raise
            except asyncio.CancelledError:
                self._client.cancel(rid)
                raise
            finally:
                self._waiting.pop(rid, None)
        raise AssertionError("unreachable")

    def _send(self) -> None:
        batch, self._batch = self._batch, []
        if not batch:
            return
        try:
            self._client.request_batch(batch)
        except Exception as exc:  # e.g. a body that is not bytes-like: the batch's requests fail, not hang
            for rid, *_ in batch:
                waiting = self._waiting.get(rid)
                if waiting is not None and not waiting[0].done():
                    waiting[0].set_exception(TransportError(f"request not sent: {exc}"))

    def _watch_deadline(self, loop: asyncio.AbstractEventLoop, limit: float, deadline: float, rid: int) -> None:
        queue = self._deadlines.get(limit)
        if queue is None:
            queue = self._deadlines[limit] = deque()
        else:
            waiting = self._waiting
            while queue and queue[0][1] not in waiting:  # answered: forgotten as the queue moves
                queue.popleft()
        queue.append((deadline, rid))
        if self._timer is None or deadline < self._timer_at:
            if self._timer is not None:
                self._timer.cancel()
            self._timer_at = deadline
            self._timer = loop.call_at(deadline, self._expire)

    def _expire(self) -> None:
        """Time out the requests whose deadline passed (cancelled in the thread), and set the
        timer for the next deadline."""
        self._timer = None
        loop = self._reader
        if loop is None:
            return
        now = loop.time()
        earliest = None
        for limit, queue in list(self._deadlines.items()):
            while queue and (queue[0][1] not in self._waiting or queue[0][0] <= now):
                deadline, rid = queue.popleft()
                waiting = self._waiting.get(rid)
                if waiting is None or deadline > now:
                    continue
                future, shape = waiting
                if not future.done():
                    self._client.cancel(rid)
                    future.set_exception(TransportTimeout(f"{shape.what}: no response within {limit} s"))
            if not queue:
                del self._deadlines[limit]
            elif earliest is None or queue[0][0] < earliest:
                earliest = queue[0][0]
        if earliest is not None:
            self._timer_at = earliest
            self._timer = loop.call_at(earliest, self._expire)

    def _watch(self, loop: asyncio.AbstractEventLoop) -> None:
        """Take finished requests on ``loop`` (one transport serves one loop at a time)."""
        if self._reader is not None and not self._reader.is_closed():
            self._reader.remove_reader(self._client.ready_fd)
        loop.add_reader(self._client.ready_fd, self._finished)
        self._reader = loop

    def _finished(self) -> None:
        for rid, failure, status, fields, body, message in self._client.take():
            waiting = self._waiting.get(rid)
            if waiting is None:
                continue  # timed out or cancelled meanwhile
            future = waiting[0]
            if future.done():
                continue
            if failure == _ANSWERED:
                headers: dict[str, str] = {}
                for name, value in fields:
                    name = name.lower()
                    headers[name] = f"{headers[name]}, {value}" if name in headers else value
                future.set_result(Response(status, body, headers))
            elif failure == _TIMEOUT:
                future.set_exception(TransportTimeout(message))
            else:
                future.set_exception(TransportError(message, retryable=failure == _REFUSED))

    async def close(self) -> None:
        await super().close()
        if self._reader is not None and not self._reader.is_closed():
            self._reader.remove_reader(self._client.ready_fd)
        self._reader = None
        self._client.stop()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._deadlines.clear()
        for future, _ in self._waiting.values():
            if not future.done():
                future.set_exception(TransportError("transport is closed"))
        self._waiting.clear()
