"""The role servers' native I/O path: sockets, TLS 1.3 and HTTP/2 framing in one C++ thread.

``sdcp_fast._nio`` (``csrc/native_io/``) owns the listening socket and every connection: the
handshake (client certificate required), decryption, nghttp2's server session, the body and
stream bounds. It queues a request once its stream ends and wakes this loop through one
eventfd per batch; :class:`NativeServer` takes the whole batch, runs the same
:data:`~sdcp_fast.transport.base.Handler` the pure-Python server runs (h2server.py), one
task per request, and hands the responses back in one call per loop iteration, to be framed
and encrypted off the GIL. Python never sees a TLS record or an HTTP/2 frame here. A
handler that is a :class:`~sdcp_fast.transport.base.DirectHandler` is asked first, in the
batch's own callback: a route it answers costs no request object, task or coroutine (an
answer still to come is a future, answered from its done-callback).

What a handler sees and what a client gets are those of h2server.py: the peer from the
client certificate's URI SANs, the path relative to the base path (404 outside it), the
problems it answers by itself (413, 503, 408, 500) with the same documents, streamed
responses sent chunk by chunk (their iterator closed when the client resets the stream).

Which server :func:`~sdcp_fast.transport.h2server.serve` starts (:func:`implementation`):
``SDCP_SERVER=py`` the pure-Python one, ``SDCP_SERVER=native`` this one (an error when it is
not built), unset: this one where it is built, else the pure-Python one (:func:`status` says
why; ``SDCP_REQUIRE_NATIVE_H2=1`` makes that an error). It serves mutual TLS from a
:func:`~sdcp_fast.transport.tls.server_context` (whose files it reads again) or h2c on
loopback; a context made otherwise, or since changed to allow TLS 1.2 or no client
certificate, is served by the pure-Python server.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib
import logging
import os
import ssl as ssl_module
from collections.abc import Coroutine, Mapping
from types import MappingProxyType, ModuleType
from typing import Any
from urllib.parse import parse_qsl, unquote

from sdcp_fast.protocol.peer import Peer, peer_from_uris
from sdcp_fast.transport.base import DirectHandler, Handler, Request, Response
from sdcp_fast.transport.fields import outbound_fields
from sdcp_fast.transport.h2conn import Limits
from sdcp_fast.transport.problem import INTERNAL_ERROR_DETAIL, http_problem
from sdcp_fast.transport.tls import ServerContext

log = logging.getLogger("sdcp_fast.transport")

PY, NATIVE = "py", "native"

# Commands and events of csrc/native_io/server.cpp (enum Op, EventKind, Refusal).
_RESPOND, _START, _CHUNK, _END, _RESET, _NOTIFY_DRAINED = range(6)
_REFUSED, _GONE, _DRAINED = range(3)
_BODY_TOO_LARGE, _CONNECTION_FULL, _SERVER_FULL, _TOO_SLOW = range(4)
_INTERNAL_ERROR = 2  # HTTP/2 error code
_NO_BODY_STATUS = frozenset({204, 304})
_HIGH_WATER = 1 << 20  # streamed bytes queued in the native thread before the pump waits for them
# (op, conn, stream, fields, data, HTTP/2 error code), as the native thread's submit() reads it.
_Command = tuple[int, int, int, list[tuple[str, str]] | None, bytes | memoryview | None, int]


@functools.cache
def _load() -> tuple[ModuleType | None, str]:
    try:
        mod = importlib.import_module("sdcp_fast._nio")
    except ImportError as exc:
        return None, (f"native I/O (sdcp_fast._nio) is missing ({exc}); it is built where libnghttp2's and "
                      "OpenSSL's headers are found (Debian: libnghttp2-dev, libssl-dev)")
    return mod, f"loaded ({mod.OPENSSL_VERSION}, nghttp2 {mod.NGHTTP2_VERSION})"


def available() -> bool:
    return _load()[0] is not None


def status() -> str:
    """One line: 'loaded (...)' or why the native server is missing."""
    return _load()[1]


_chosen: str | None = None  # tests pin one server (use()); None: from the environment


def use(name: str | None) -> None:
    """Pin the server :func:`~sdcp_fast.transport.h2server.serve` starts (``py``, ``native``, None: default)."""
    global _chosen
    if name not in (None, PY, NATIVE):
        raise ValueError(f"unknown server {name!r}")
    _chosen = name


def implementation() -> str:
    """``native`` or ``py``: what :func:`~sdcp_fast.transport.h2server.serve` starts now."""
    wanted = _chosen or os.environ.get("SDCP_SERVER", "").strip().lower()
    if wanted in ("py", "python"):
        return PY
    if wanted not in ("", NATIVE, "c"):
        raise ValueError(f"SDCP_SERVER={wanted!r}: expected py or native")
    if available():
        return NATIVE
    if wanted or os.environ.get("SDCP_REQUIRE_NATIVE_H2") == "1":
        raise ImportError(status())
    _fallback_noted()
    return PY


@functools.cache
def _fallback_noted() -> None:
    log.warning("the role servers use the pure-Python path: %s", status())


def serves(ssl: ssl_module.SSLContext | None) -> bool:
    """Whether the native server is chosen and can serve ``ssl`` (None: h2c): a
    :func:`~sdcp_fast.transport.tls.server_context` still requiring TLS 1.3 and a client
    certificate, the only settings the native thread takes (from the context's files)."""
    if implementation() != NATIVE:
        return False
    if ssl is None:
        return True
    # A context changed after it was made (the conformance kit's planted TLS 1.2, say) keeps
    # Python's TLS, which honours what was changed, instead of being served as made.
    return (isinstance(ssl, ServerContext) and ssl.minimum_version == ssl_module.TLSVersion.TLSv1_3
            and ssl.verify_mode == ssl_module.CERT_REQUIRED)


@functools.lru_cache(maxsize=1024)
def _peer(uris: tuple[str, ...]) -> Peer:
    return peer_from_uris(uris)


def _query(raw: str) -> dict[str, str]:
    """``parse_qsl(raw, keep_blank_values=True)`` as a dict; one plain ``name=value`` (a
    long-poll's ``from=n``) without the parser."""
    if not raw:
        return {}
    if "&" in raw or "%" in raw or "+" in raw:
        return dict(parse_qsl(raw, keep_blank_values=True))
    name, _, value = raw.partition("=")
    return {name: value} if name or value else {}


_EMPTY: Mapping[str, str] = MappingProxyType({})


class NativeServer:
    """A listening server whose connections live in the native thread; :func:`serve` makes one."""

    def __init__(self, core: Any, handler: Handler, limits: Limits, base_path: str) -> None:
        self._core = core
        self.handler = handler
        self._direct = handler if isinstance(handler, DirectHandler) else None
        # The fields of read-only header mappings (a role's message answers share one).
        self._fields: dict[int, tuple[Mapping[str, str], list[tuple[str, str]]]] = {}
        self.limits = limits
        self.base_path = "/" + base_path.strip("/") + "/" if base_path.strip("/") else "/"
        self.closing = False
        self._loop = asyncio.get_running_loop()
        self._out: list[_Command] = []
        self._flush_pending = False
        self._pumps: dict[tuple[int, int], asyncio.Task[None]] = {}
        self._drained: dict[tuple[int, int], asyncio.Future[None]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop.add_reader(core.ready_fd, self._ready)

    @property
    def port(self) -> int:
        return int(self._core.port)

    @property
    def accepted(self) -> int:
        """Connections that completed TLS (with a verified client) and chose h2."""
        return int(self._core.accepted)

    def close(self) -> None:
        """Stop accepting; GOAWAY every connection (each closes when its streams are done)."""
        if not self.closing:
            self.closing = True
            self._core.close()

    async def wait_closed(self, grace: float = 5.0) -> None:
        """Wait for the connections to finish their streams, at most ``grace`` seconds."""
        deadline = self._loop.time() + grace
        while self._core.connections and self._loop.time() < deadline:
            await asyncio.sleep(0.02)
        self._loop.remove_reader(self._core.ready_fd)
        self._core.stop()
        for pump in list(self._pumps.values()):
            pump.cancel()

    async def __aenter__(self) -> NativeServer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()
        await self.wait_closed()

    # -- from the native thread ------------------------------------------------------------
    def _ready(self) -> None:
        requests, events = self._core.take()
        direct, base = self._direct, self.base_path
        for conn, sid, method, path, headers, body, uris in requests:
            if direct is not None:
                raw_path, _, raw_query = path.partition("?")
                if raw_path.startswith(base) and "%" not in raw_path:
                    answer = self._answer_now(direct, conn, sid, method, raw_path[len(base):], raw_query, headers,
                                              body, uris)
                    if answer:
                        continue
            self._spawn(self._respond(conn, sid, method, path, headers, body, uris))
        for kind, conn, sid, code in events:
            if kind == _REFUSED:
                self._answer(conn, sid, self._refusal(code))
            elif kind == _GONE:
                pump = self._pumps.get((conn, sid))
                if pump is not None:
                    pump.cancel()  # the client left a streamed response: stop producing
                self._wake_drained((conn, sid))
            elif kind == _DRAINED:
                self._wake_drained((conn, sid))

    def _answer_now(self, direct: DirectHandler, conn: int, sid: int, method: str, path: str, raw_query: str,
                    headers: dict[str, str], body: bytes, uris: tuple[str, ...] | None) -> bool:
        """Whether ``direct`` took the request: answered now, or when its future is done."""
        try:
            answer = direct.answer_now(method, path, _query(raw_query) if raw_query else _EMPTY, body, headers,
                                       _peer(uris) if uris is not None else None)
        except Exception:
            log.exception("handler failed: %s /%s", method, path)
            answer = http_problem(500, INTERNAL_ERROR_DETAIL)
        if answer is None:
            return False
        if isinstance(answer, Response):
            self._send(conn, sid, answer)
        else:
            answer.add_done_callback(functools.partial(self._settled, direct, conn, sid))
        return True

    def _settled(self, direct: DirectHandler, conn: int, sid: int, future: asyncio.Future[Any]) -> None:
        try:
            response = direct.settled(future)
        except asyncio.CancelledError:  # no answer will come: reset the stream, which frees it
            self._push((_RESET, conn, sid, None, None, _INTERNAL_ERROR))
            return
        except Exception:
            log.exception("handler failed on stream %d", sid)
            response = http_problem(500, INTERNAL_ERROR_DETAIL)
        self._send(conn, sid, response)

    def _send(self, conn: int, sid: int, response: Response) -> None:
        """Answer with ``response`` (not streamed), or reset the stream if it cannot be sent."""
        try:
            if response.stream is not None:
                raise TypeError("a streamed response is not a direct answer")
            self._answer(conn, sid, response)
        except Exception:
            log.exception("cannot answer stream %d", sid)
            self._push((_RESET, conn, sid, None, None, _INTERNAL_ERROR))

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = self._loop.create_task(coro)
        self._tasks.add(task)  # held until done: the loop keeps only weak references
        task.add_done_callback(self._tasks.discard)

    def _refusal(self, code: int) -> Response:
        limits = self.limits
        if code == _BODY_TOO_LARGE:
            return http_problem(413, f"request body over {limits.max_body} bytes")
        if code == _CONNECTION_FULL:
            return http_problem(503, "request bodies on this connection over "
                                f"{max(limits.max_buffered, limits.max_body)} bytes")
        if code == _SERVER_FULL:
            return http_problem(503, "request bodies on this server over "
                                f"{max(limits.max_buffered_total, limits.max_body)} bytes")
        return http_problem(408, f"request body not complete within {limits.request_timeout:g} s")

    async def _respond(self, conn: int, sid: int, method: str, path: str, headers: dict[str, str], body: bytes,
                       uris: tuple[str, ...] | None) -> None:
        raw_path, _, raw_query = path.partition("?")
        if not raw_path.startswith(self.base_path):
            self._answer(conn, sid, http_problem(404, f"outside this instance's base path {self.base_path}"))
            return
        peer = _peer(uris) if uris is not None else None
        request = Request(method=method, path=unquote(raw_path[len(self.base_path):]),
                          query=_query(raw_query) if raw_query else {}, body=body, headers=headers, peer=peer)
        try:
            response = await self.handler(request)
        except Exception:
            log.exception("handler failed: %s /%s from %s", request.method, request.path, peer)
            response = http_problem(500, INTERNAL_ERROR_DETAIL)
        except asyncio.CancelledError:
            # No answer can be awaited now: reset the stream, which frees it.
            self._push((_RESET, conn, sid, None, None, _INTERNAL_ERROR))
            raise
        if response.stream is not None and response.status not in _NO_BODY_STATUS:
            pump = self._loop.create_task(self._pump(conn, sid, response))
            self._pumps[(conn, sid)] = pump
            try:
                await asyncio.wait([pump])
            finally:
                self._pumps.pop((conn, sid), None)
                if not pump.done():
                    pump.cancel()
                await _close_stream(response)
            if not pump.cancelled() and pump.exception() is not None:
                log.error("streamed response on stream %d failed: %r", sid, pump.exception(),
                          exc_info=pump.exception())
                self._push((_RESET, conn, sid, None, None, _INTERNAL_ERROR))
            return
        if response.stream is not None:
            await _close_stream(response)  # no body allowed: not sent
        try:
            self._answer(conn, sid, response)
        except Exception:
            # Not an answer that can be sent (a body that is no bytes-like object): the
            # stream is reset rather than left open for the client's timeout.
            log.exception("cannot answer stream %d: %s /%s from %s", sid, request.method, request.path, peer)
            self._push((_RESET, conn, sid, None, None, _INTERNAL_ERROR))

    def _answer(self, conn: int, sid: int, response: Response) -> None:
        body: bytes | memoryview = response.body if response.status not in _NO_BODY_STATUS else b""
        if type(body) is not bytes:
            # Any bytes-like body (the MLC answers with memoryviews of its tiers), counted in
            # bytes, not items; the native thread copies a contiguous one as it is.
            body = memoryview(body)
            if not body.c_contiguous:
                body = body.tobytes()
        fields = [(":status", str(response.status)), *self._header_fields(response.headers),
                  ("content-length", str(body.nbytes if isinstance(body, memoryview) else len(body)))]
        self._push((_RESPOND, conn, sid, fields, body, 0))

    def _header_fields(self, headers: Mapping[str, str]) -> list[tuple[str, str]]:
        if type(headers) is not MappingProxyType:
            return [f for f in outbound_fields(dict(headers)) if f[0] != "content-length"]
        kept = self._fields.get(id(headers))
        if kept is None or kept[0] is not headers:
            if len(self._fields) >= 64:
                self._fields.clear()
            kept = self._fields[id(headers)] = (headers, [f for f in outbound_fields(dict(headers))
                                                         if f[0] != "content-length"])
        return kept[1]

    async def _pump(self, conn: int, sid: int, response: Response) -> None:
        assert response.stream is not None
        fields = [(":status", str(response.status))]
        fields += self._header_fields(response.headers)
        self._push((_START, conn, sid, fields, None, 0), now=True)
        queued = 0
        async for chunk in response.stream:
            if not chunk:
                continue
            self._push((_CHUNK, conn, sid, None, bytes(chunk), 0), now=True)
            queued += len(chunk)
            if queued >= _HIGH_WATER:
                # The client reads slower than we produce: wait until the native thread has
                # framed what it holds (or the stream is gone).
                waiter = self._loop.create_future()
                self._drained[(conn, sid)] = waiter
                self._push((_NOTIFY_DRAINED, conn, sid, None, None, 0), now=True)
                await waiter
                queued = 0
        self._push((_END, conn, sid, None, None, 0), now=True)

    def _wake_drained(self, key: tuple[int, int]) -> None:
        waiter = self._drained.pop(key, None)
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # -- to the native thread ----------------------------------------------------------------
    def _push(self, command: _Command, now: bool = False) -> None:
        """Queue a command; all queued in one loop iteration go over in one call."""
        self._out.append(command)
        if now:
            self._flush()
        elif not self._flush_pending:
            self._flush_pending = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_pending = False
        if self._out:
            batch, self._out = self._out, []
            try:
                self._core.submit(batch)
            except Exception:  # the thread took the rest of the batch and reset the stream it could not
                log.exception("a response the native thread could not take")


async def _close_stream(response: Response) -> None:
    close = getattr(response.stream, "aclose", None)
    if close is not None:
        with contextlib.suppress(Exception):
            await close()


async def serve(handler: Handler, host: str, port: int, *, ssl: ServerContext | None, limits: Limits,
                base_path: str, handshake_timeout: float) -> NativeServer:
    """Listen on ``host:port`` (0: any free port) and serve ``handler`` from the native thread;
    :func:`~sdcp_fast.transport.h2server.serve` checks the arguments and calls this."""
    mod = _load()[0]
    if mod is None:
        raise ImportError(status())
    cert, key, ca = ssl.files if ssl is not None else (None, None, None)
    core = mod.Server(host, port, cert, key, ca, max_body=limits.max_body, max_header_list=limits.max_header_list,
                      max_streams=limits.max_streams, max_buffered=limits.max_buffered,
                      max_buffered_total=limits.max_buffered_total, stream_window=limits.stream_window,
                      connection_window=limits.connection_window, max_frame=limits.max_frame,
                      idle_timeout=limits.idle_timeout, request_timeout=limits.request_timeout,
                      handshake_timeout=handshake_timeout)
    return NativeServer(core, handler, limits, base_path)

