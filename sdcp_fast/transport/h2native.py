"""HTTP/2 framing and HPACK in nghttp2, behind the surface of ``h2``'s connection.

:class:`NativeConnection` offers the part of :class:`h2.connection.H2Connection` that
:mod:`sdcp_fast.transport.h2conn` uses (``receive_data`` -> ``h2.events`` objects,
``send_headers``/``send_data``/``end_stream``/``reset_stream``, windows, ``data_to_send``),
raising ``h2.exceptions`` as h2 does, so the asyncio adapters run unchanged on either.
Two additions the adapters use where they exist: ``whole_messages=True`` hands a request
(server) or response (client) whose headers, body and end all came in one ``receive_data``
call on as one :class:`WholeMessage` (its bytes already returned to the peer's windows)
instead of three events, and :meth:`NativeConnection.send_message` sends a message's headers,
body and end in one call when the body fits the peer's windows.
The frames, HPACK and flow-control arithmetic are nghttp2's (``sdcp_fast._h2``, built from
``csrc/nghttp2/`` where libnghttp2's headers are found); only the event objects are made here.

Which one a connection uses (:func:`implementation`): ``SDCP_H2=py`` the pure-Python ``h2``,
``SDCP_H2=c`` nghttp2 (an error when it is not built), unset: nghttp2 when built, else ``h2``
(:func:`status` says why). ``SDCP_REQUIRE_NATIVE_H2=1`` turns a missing build into an error.
"""

from __future__ import annotations

import functools
import importlib
import os
from types import ModuleType, SimpleNamespace
from typing import Any

import h2.events
import h2.exceptions
import h2.settings
from h2.errors import ErrorCodes

PY, C = "py-h2", "c-h2"

# Event kinds sent by csrc/nghttp2/h2_session.cpp (enum Kind).
_HEADERS, _TRAILERS, _DATA, _ENDED, _RESET, _WINDOW, _SETTINGS, _GOAWAY, _SETTINGS_ACK, _PING, _WHOLE = range(11)


@functools.cache
def _load() -> tuple[ModuleType | None, str]:
    try:
        mod = importlib.import_module("sdcp_fast._h2")
    except ImportError as exc:
        return None, (f"native HTTP/2 (sdcp_fast._h2) is missing ({exc}); it is built when libnghttp2's "
                      "headers are found (Debian: libnghttp2-dev) - using the pure-Python h2 meanwhile")
    return mod, f"loaded (nghttp2 {mod.NGHTTP2_VERSION})"


def available() -> bool:
    return _load()[0] is not None


def status() -> str:
    """One line: 'loaded (nghttp2 X)' or why the native HTTP/2 path is missing."""
    return _load()[1]


_chosen: str | None = None  # tests pin one implementation (use()); None: from the environment


def use(name: str | None) -> None:
    """Pin the implementation new connections get (``py-h2``, ``c-h2``, or None for the default)."""
    global _chosen
    if name not in (None, PY, C):
        raise ValueError(f"unknown HTTP/2 implementation {name!r}")
    _chosen = name


def implementation() -> str:
    """``c-h2`` or ``py-h2``: what a new connection gets now."""
    if _chosen is not None:
        wanted = _chosen
    else:
        env = os.environ.get("SDCP_H2", "").strip().lower()
        if env in ("py", "python", PY):
            return PY
        wanted = C if env in ("c", "native", "nghttp2", C) or os.environ.get("SDCP_REQUIRE_NATIVE_H2") == "1" \
            else ""
    if wanted == PY:
        return PY
    if available():
        return C
    if wanted == C:
        raise ImportError(status())
    return PY


def native_connection(client_side: bool, whole_messages: bool = False) -> NativeConnection | None:
    """A nghttp2 connection when that is the implementation in use, else None (use h2's)."""
    return NativeConnection(client_side, whole_messages) if implementation() == C else None


class WholeMessage(h2.events.Event):
    """A request (server) or response (client) received whole (``whole_messages``): what
    ``RequestReceived``/``ResponseReceived``, its ``DataReceived`` events and ``StreamEnded``
    would say, as one event. Its body's bytes were returned to the peer's windows already (no
    ``acknowledge_received_data``)."""

    __slots__ = ("stream_id", "headers", "data")

    def __init__(self, stream_id: int, headers: list[tuple[bytes, bytes]], data: bytes) -> None:
        self.stream_id = stream_id
        self.headers = headers
        self.data = data

    def __repr__(self) -> str:
        return f"<WholeMessage stream_id:{self.stream_id}, headers:{self.headers}, data:{len(self.data)} bytes>"


class _Streams:
    """``conn.streams.get(id)``: enough of h2's stream table for ``.closed``."""

    def __init__(self, session: Any) -> None:
        self._session = session

    def get(self, stream_id: int, default: Any = None) -> Any:
        state = self._session.stream_state(stream_id)
        if state is None:
            return default
        return SimpleNamespace(closed=state[0] and state[1])

    def __contains__(self, stream_id: int) -> bool:
        return self._session.stream_state(stream_id) is not None


class _RemoteSettings:
    def __init__(self, session: Any) -> None:
        self._session = session

    @property
    def max_concurrent_streams(self) -> int:
        return int(self._session.remote_setting(h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS))

    @property
    def max_frame_size(self) -> int:
        return int(self._session.remote_setting(h2.settings.SettingCodes.MAX_FRAME_SIZE))


class NativeConnection:
    """The part of ``h2.connection.H2Connection`` the transport uses, on nghttp2."""

    def __init__(self, client_side: bool, whole_messages: bool = False) -> None:
        mod = _load()[0]
        if mod is None:
            raise ImportError(status())
        self._mod = mod
        self._s = mod.Session(client_side)
        if whole_messages:
            self._s.set_whole_messages(True)
        self.client_side = client_side
        self.local_settings: h2.settings.Settings | dict[int, int] = {}
        # Set by the adapter as on h2; nghttp2 takes both bounds from the SETTINGS we send.
        self.max_inbound_frame_size = 16384
        self.decoder = SimpleNamespace(max_header_list_size=None)
        self.streams = _Streams(self._s)
        self.remote_settings = _RemoteSettings(self._s)

    def _call(self, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except self._mod.StreamClosed as exc:
            raise h2.exceptions.StreamClosedError(args[0] if args else 0) from exc
        except self._mod.ProtocolError as exc:
            raise h2.exceptions.ProtocolError(str(exc)) from exc

    # -- connection --------------------------------------------------------------------
    def initiate_connection(self) -> None:
        values = [(int(code), int(value)) for code, value in dict(self.local_settings).items()]
        self._call(self._s.submit_settings, values)

    def increment_flow_control_window(self, increment: int, stream_id: int | None = None) -> None:
        self._call(self._s.increment_window, stream_id or 0, increment)

    def close_connection(self, error_code: int = 0) -> None:
        self._call(self._s.terminate, int(error_code))

    @property
    def highest_inbound_stream_id(self) -> int:
        return int(self._s.last_proc_stream_id())

    @property
    def max_outbound_frame_size(self) -> int:
        return self.remote_settings.max_frame_size

    def get_next_available_stream_id(self) -> int:
        return int(self._s.next_stream_id())

    def data_to_send(self, amount: int | None = None) -> bytes:
        return bytes(self._s.data_to_send())

    # -- streams -----------------------------------------------------------------------
    def send_headers(self, stream_id: int, headers: list[tuple[str, str]], end_stream: bool = False) -> None:
        self._call(self._s.submit_headers, stream_id, headers, end_stream)

    def send_message(self, stream_id: int, headers: list[tuple[str, str]], body: bytes) -> bool:
        """``send_headers`` (ending the stream when ``body`` is empty), then ``body`` and
        END_STREAM when it fits the peer's windows now: True when all of it was sent, False
        when the body is still to send (``send_data`` as the windows open)."""
        try:
            return bool(self._s.send_message(stream_id, headers, body))
        except self._mod.StreamClosed as exc:
            raise h2.exceptions.StreamClosedError(stream_id) from exc
        except self._mod.ProtocolError as exc:
            raise h2.exceptions.ProtocolError(str(exc)) from exc

    def send_data(self, stream_id: int, data: bytes | memoryview, end_stream: bool = False) -> None:
        self._call(self._s.send_data, stream_id, data, end_stream)

    def end_stream(self, stream_id: int) -> None:
        self._call(self._s.end_stream, stream_id)

    def reset_stream(self, stream_id: int, error_code: int = 0) -> None:
        self._call(self._s.reset_stream, stream_id, int(error_code))

    def local_flow_control_window(self, stream_id: int) -> int:
        return int(self._call(self._s.send_window, stream_id))

    def acknowledge_received_data(self, acknowledged_size: int, stream_id: int) -> None:
        self._s.consume(stream_id, acknowledged_size)

    # -- receiving ---------------------------------------------------------------------
    def receive_data(self, data: bytes | memoryview) -> list[h2.events.Event]:
        try:
            raw = self._s.receive(data)
        except self._mod.ProtocolError as exc:
            raise h2.exceptions.ProtocolError(str(exc)) from exc
        client_side = self.client_side
        return [WholeMessage(item[1], item[2], item[4]) if item[0] == _WHOLE else _event(client_side, *item)
                for item in raw]


def _code(value: int) -> ErrorCodes | int:
    try:
        return ErrorCodes(value)
    except ValueError:
        return value


def _event(client_side: bool, kind: int, stream_id: int, payload: Any, n: int) -> h2.events.Event:
    if kind == _DATA:
        return h2.events.DataReceived(stream_id=stream_id, data=payload, flow_controlled_length=n)
    if kind == _HEADERS:
        ended = h2.events.StreamEnded(stream_id=stream_id) if n else None
        cls = h2.events.ResponseReceived if client_side else h2.events.RequestReceived
        return cls(stream_id=stream_id, headers=payload, stream_ended=ended)
    if kind == _ENDED:
        return h2.events.StreamEnded(stream_id=stream_id)
    if kind == _TRAILERS:
        return h2.events.TrailersReceived(stream_id=stream_id, headers=payload)
    if kind == _RESET:
        return h2.events.StreamReset(stream_id=stream_id, error_code=_code(n), remote_reset=bool(payload))
    if kind == _WINDOW:
        return h2.events.WindowUpdated(stream_id=stream_id, delta=n)
    if kind == _SETTINGS:
        event = h2.events.RemoteSettingsChanged()
        event.changed_settings = {code: h2.settings.ChangedSetting(code, None, value) for code, value in payload.items()}
        return event
    if kind == _GOAWAY:
        terminated = h2.events.ConnectionTerminated()
        terminated.error_code = _code(n)
        terminated.last_stream_id, debug = payload
        terminated.additional_data = debug or None
        return terminated
    if kind == _SETTINGS_ACK:
        return h2.events.SettingsAcknowledged()
    return h2.events.PingReceived(ping_data=payload)
