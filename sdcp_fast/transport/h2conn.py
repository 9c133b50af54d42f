"""One HTTP/2 connection over an asyncio transport: what the server and the client share.

The sans-I/O ``h2`` library holds the protocol state; :class:`H2Protocol` is the asyncio
adapter around it (bytes in -> events, ``data_to_send()`` -> socket), sending bodies within
the peer's flow-control windows and the socket's write buffer, acknowledging received data
as it is buffered (the body bound, not the window, caps memory), and closing the connection
after an idle period. Subclasses handle the stream events of their side. It runs the same
over TLS (ALPN ``h2`` required) and over plain TCP (h2c with prior knowledge, --insecure).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings
import hyperframe.frame
from h2.errors import ErrorCodes
from hyperframe.frame import Frame, GoAwayFrame, HeadersFrame

from sdcp_fast.transport.errors import TransportError
from sdcp_fast.transport.h2native import WholeMessage, native_connection

log = logging.getLogger("sdcp_fast.transport")

MiB = 1 << 20


def _short_data_repr(data: bytes | None) -> str:
    if not data:
        return "None"
    r = bytes(data[:11]).hex()
    return "<hex:" + (r[:20] + "..." if len(r) > 20 else r) + ">"


# h2 formats every received frame for its trace log whether or not it is enabled, and
# hyperframe hex-encodes a DATA frame's whole payload to show its first 10 bytes: about
# 2.5 ms per MiB received. Same text, from the first 11 bytes only.
hyperframe.frame._raw_data_repr = _short_data_repr

@dataclass(frozen=True)
class Limits:
    """Bounds of one side of a connection (each advertised to the peer where HTTP/2 can)."""

    max_body: int = 64 * MiB  # a larger request body gets 413 (server); a larger response fails (client)
    max_header_list: int = 64 * 1024  # SETTINGS_MAX_HEADER_LIST_SIZE; h2 ends a connection exceeding it
    max_streams: int = 256  # SETTINGS_MAX_CONCURRENT_STREAMS: streams the peer may open at once
    idle_timeout: float = 120.0  # seconds without an open stream before the connection is closed
    # Seconds from a request's headers to the end of its body (server): a slower request
    # (slow-loris) is answered 408 and its buffered bytes are freed.
    request_timeout: float = 60.0
    # Request-body bytes one connection may hold across its streams before their requests end
    # (server; at least max_body): beyond it the stream that overflows is answered 503.
    max_buffered: int = 256 * MiB
    # The same across all connections of a server (at least max_body): many connections
    # cannot each hold max_buffered of bodies still arriving.
    max_buffered_total: int = 1024 * MiB
    stream_window: int = 4 * MiB  # SETTINGS_INITIAL_WINDOW_SIZE: per-stream receive window
    connection_window: int = 16 * MiB  # receive window of the whole connection
    max_frame: int = 1 * MiB - 1  # SETTINGS_MAX_FRAME_SIZE: fewer, larger DATA frames for big bodies


class StreamGone(Exception):
    """The stream was reset or the connection ended while we were sending on it."""


class _Connection(h2.connection.H2Connection):
    """h2's connection, except that a graceful GOAWAY received (NO_ERROR) leaves the state
    open so the streams up to its last stream id can finish (RFC 9113 §6.8; h2 would close
    everything at once, python-hyper/h2#1181). The protocol opens no new streams after it.

    And a stream the peer opens past our SETTINGS_MAX_CONCURRENT_STREAMS is refused alone
    (RST_STREAM REFUSED_STREAM, RFC 9113 §5.1.2: a stream error, safe to retry), where h2 ends
    the whole connection (PROTOCOL_ERROR) and with it every request in flight on it."""

    def _receive_headers_frame(self, frame: HeadersFrame) -> tuple[list[Frame], list[h2.events.Event]]:
        if frame.stream_id in self.streams or self.open_inbound_streams < self.local_settings.max_concurrent_streams:
            return super()._receive_headers_frame(frame)
        # The header block is decoded all the same: HPACK's state belongs to the connection.
        headers = h2.connection._decode_headers(self.decoder, frame.data)
        events = self.state_machine.process_input(h2.connection.ConnectionInputs.RECV_HEADERS)
        stream = self._get_or_create_stream(frame.stream_id, h2.connection.AllowedStreamIDs(not self.config.client_side))
        stream.receive_headers(headers, "END_STREAM" in frame.flags, self.config.header_encoding)
        frames = stream.reset_stream(ErrorCodes.REFUSED_STREAM)
        return frames, events  # the request is never handed on: nothing was processed

    def _receive_goaway_frame(self, frame: GoAwayFrame) -> tuple[list[Frame], list[h2.events.Event]]:
        if frame.error_code != ErrorCodes.NO_ERROR:
            return super()._receive_goaway_frame(frame)
        event = h2.events.ConnectionTerminated()
        event.error_code = ErrorCodes.NO_ERROR
        event.last_stream_id = frame.last_stream_id
        event.additional_data = frame.additional_data or None
        return [], [event]


class H2Protocol(asyncio.Protocol):
    """The shared half of a connection; :meth:`on_event` is the side-specific rest."""

    client_side = False
    whole_messages = True  # nghttp2 hands on a message received whole as one event (WholeMessage)

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        # Outbound fields are ours (lower-case, no connection-specific ones: outbound_fields),
        # so h2's per-field checks of what we send are skipped; what we receive is checked.
        # nghttp2 where it is built (h2native says which), else h2: the same surface either way.
        native = native_connection(self.client_side, self.whole_messages)
        self.conn = cast(_Connection, native) if native is not None else _Connection(h2.config.H2Configuration(
            client_side=self.client_side, header_encoding=None,
            validate_outbound_headers=False, normalize_outbound_headers=False))
        # nghttp2's one-call message (h2 has none)
        self._send_message: Callable[[int, list[tuple[str, str]], bytes], bool] | None = \
            native.send_message if native is not None else None
        self.transport: asyncio.Transport | None = None
        self.loop = asyncio.get_running_loop()
        self.closed: asyncio.Future[None] = self.loop.create_future()
        self._flush_pending = False
        self._can_write = True
        self._write_waiters: list[asyncio.Future[None]] = []
        self._window_waiters: dict[int, asyncio.Future[None]] = {}
        self._idle_timer: asyncio.TimerHandle | None = None
        self._last_active = self.loop.time()
        self.active_streams = 0
        self.draining = False  # we sent GOAWAY: no new streams from the peer
        self.peer_goaway = False  # the peer sent GOAWAY: we open no new streams

    # -- connection lifecycle ------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses but have its methods.
        self.transport = cast(asyncio.Transport, transport)
        ssl_object = transport.get_extra_info("ssl_object")
        if ssl_object is not None and ssl_object.selected_alpn_protocol() != "h2":
            log.warning("closing connection from %s: ALPN %r, not h2", transport.get_extra_info("peername"),
                        ssl_object.selected_alpn_protocol())
            self.transport.abort()
            return
        self.conn.local_settings = h2.settings.Settings(client=self.client_side, initial_values={
            h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: self.limits.max_streams,
            h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE: self.limits.max_header_list,
            h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: self.limits.stream_window,
            h2.settings.SettingCodes.MAX_FRAME_SIZE: self.limits.max_frame,
            h2.settings.SettingCodes.ENABLE_PUSH: 0,
        })
        # These settings are ours from the start (sent in our first SETTINGS frame), so the
        # inbound bounds h2 otherwise updates on the peer's ACK are set here directly.
        self.conn.max_inbound_frame_size = self.limits.max_frame
        self.conn.decoder.max_header_list_size = self.limits.max_header_list
        self.conn.initiate_connection()
        extra = self.limits.connection_window - 65535  # 65,535: every connection's initial window
        if extra > 0:
            self.conn.increment_flow_control_window(extra)
        self.flush()
        self._arm_idle(self.limits.idle_timeout)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if self._idle_timer:
            self._idle_timer.cancel()
        for waiter in [*self._write_waiters, *self._window_waiters.values()]:
            if not waiter.done():
                waiter.set_result(None)
        self._write_waiters.clear()
        self._window_waiters.clear()
        if not self.closed.done():
            self.closed.set_result(None)
        self.on_lost(exc)

    def data_received(self, data: bytes) -> None:
        try:
            events = self.conn.receive_data(data)
        except h2.exceptions.ProtocolError as exc:
            # h2 queued a GOAWAY with the right code; send it and drop the connection.
            log.warning("HTTP/2 protocol error from %s: %s", self.peername, exc)
            self.flush()
            if self.transport:
                self.transport.close()
            return
        for event in events:
            if type(event) is WholeMessage:  # the common event, none of the cases below
                self.on_event(event)
                continue
            if isinstance(event, h2.events.ConnectionTerminated):
                self.peer_goaway = True
            if isinstance(event, (h2.events.WindowUpdated, h2.events.RemoteSettingsChanged)):
                self._wake_windows(getattr(event, "stream_id", 0))
            elif isinstance(event, (h2.events.StreamReset, h2.events.StreamEnded)) and \
                    event.stream_id in self._window_waiters:
                self._wake_windows(event.stream_id)
            self.on_event(event)
        self.flush()

    @property
    def peername(self) -> object:
        return self.transport.get_extra_info("peername") if self.transport else None

    def close(self) -> None:
        """Graceful close: GOAWAY now, the socket once the open streams are done.

        h2 puts the whole connection in its CLOSED state when a GOAWAY is sent through it, so
        the streams in flight could not be answered (python-hyper/h2#1181); RFC 9113 §6.8
        lets them finish. We therefore write this first GOAWAY ourselves and send h2's own
        (final) one when the last stream ends."""
        if self.transport is None or self.draining:
            return
        self.draining = True
        self.flush()  # keep frame order: h2's queued frames first
        frame = GoAwayFrame(0)
        frame.last_stream_id = self.conn.highest_inbound_stream_id
        frame.error_code = ErrorCodes.NO_ERROR
        self.transport.write(frame.serialize())
        if self.active_streams == 0:
            self._final_close()

    def _final_close(self) -> None:
        if self.transport is None:
            return
        try:
            self.conn.close_connection()
        except h2.exceptions.ProtocolError:
            pass  # h2 already closed it (the peer's error GOAWAY)
        self.flush()
        self.transport.close()

    # -- side-specific hooks -------------------------------------------------------------
    def on_event(self, event: h2.events.Event) -> None:
        raise NotImplementedError

    def on_lost(self, exc: Exception | None) -> None:
        pass

    def stream_started(self) -> None:
        self.active_streams += 1

    def stream_finished(self) -> None:
        self.active_streams -= 1
        if self.active_streams == 0:  # idle from now (the idle check reads it only then)
            self._last_active = self.loop.time()
            if self.draining or self.peer_goaway:
                self._final_close()  # a GOAWAY went one way or the other and the last stream ended

    # -- writing -------------------------------------------------------------------------
    def flush(self) -> None:
        self._flush_pending = False
        data = self.conn.data_to_send()
        if data and self.transport is not None:
            self.transport.write(data)

    def flush_soon(self) -> None:
        """Coalesce the frames of everything done in this loop iteration into one write."""
        if not self._flush_pending:
            self._flush_pending = True
            self.loop.call_soon(self.flush)

    def flush_stream_end(self) -> None:
        """After a stream's last frame: write at once when it is the only stream (saves a
        loop iteration of latency), else coalesce with the others finishing now."""
        if self.active_streams <= 1:
            self.flush()
        else:
            self.flush_soon()

    def pause_writing(self) -> None:
        self._can_write = False

    def resume_writing(self) -> None:
        self._can_write = True
        waiters, self._write_waiters = self._write_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def _drain(self) -> None:
        if not self._can_write and self.transport is not None:
            waiter = self.loop.create_future()
            self._write_waiters.append(waiter)
            await waiter

    def _wake_windows(self, stream_id: int) -> None:
        if stream_id == 0:
            waiters = list(self._window_waiters.values())
            self._window_waiters.clear()
        else:
            waiter = self._window_waiters.pop(stream_id, None)
            waiters = [waiter] if waiter else []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def send_message(self, stream_id: int, fields: list[tuple[str, str]], body: bytes) -> bool:
        """Headers (ending the stream when ``body`` is empty), then, with nghttp2 and when it
        fits the peer's windows, ``body`` and the end in the same call. True: all of it is
        queued; False: :meth:`send_body` still has to send ``body``."""
        if self._send_message is not None:
            return self._send_message(stream_id, fields, body)
        self.conn.send_headers(stream_id, fields, end_stream=not body)
        return not body

    async def send_body(self, stream_id: int, body: bytes, abandon: asyncio.Future[Any] | None = None,
                        failed_only: bool = False) -> None:
        """Send ``body`` and end the stream, in frames that fit the peer's windows.

        Raises :class:`StreamGone` if the stream is reset or the connection ends first, or
        (after resetting the stream) once ``abandon`` is done: a client stops sending a
        request whose response is already complete. With ``failed_only``, once ``abandon``
        failed: a streamed response is done at its headers while its request goes on."""
        view = memoryview(body)
        offset, size = 0, len(body)
        while True:
            if self.transport is None:
                raise StreamGone(stream_id)
            if abandon is not None and abandon.done() and \
                    (not failed_only or abandon.cancelled() or abandon.exception() is not None):
                try:
                    self.conn.reset_stream(stream_id, ErrorCodes.CANCEL)
                    self.flush_soon()
                except h2.exceptions.ProtocolError:
                    pass
                raise StreamGone(stream_id)
            try:
                if offset == size:
                    self.conn.end_stream(stream_id)
                    break
                window = self.conn.local_flow_control_window(stream_id)
                if window > 0:
                    n = min(window, self.conn.max_outbound_frame_size, size - offset)
                    self.conn.send_data(stream_id, view[offset:offset + n], end_stream=offset + n == size)
                    offset += n
                    if offset == size:
                        break
                    if n < size - offset and not self._can_write:
                        self.flush()
                        await self._drain()
                    continue
            except (h2.exceptions.StreamClosedError, h2.exceptions.ProtocolError) as exc:
                raise StreamGone(stream_id) from exc
            # The peer's window is empty: send what we have and wait for a WINDOW_UPDATE.
            self.flush()
            waiter = self.loop.create_future()
            self._window_waiters[stream_id] = waiter
            await waiter
        self.flush_stream_end()

    async def send_chunk(self, stream_id: int, data: bytes) -> None:
        """Send ``data`` on an open stream without ending it (a streamed body), in frames that
        fit the peer's windows, and write it out now: a chunk is sent when it is produced.

        Raises :class:`StreamGone` if the stream is reset or the connection ends first."""
        view = memoryview(data)
        offset, size = 0, len(data)
        while offset < size:
            if self.transport is None:
                raise StreamGone(stream_id)
            try:
                window = self.conn.local_flow_control_window(stream_id)
                if window > 0:
                    n = min(window, self.conn.max_outbound_frame_size, size - offset)
                    self.conn.send_data(stream_id, view[offset:offset + n])
                    offset += n
                    continue
            except (h2.exceptions.StreamClosedError, h2.exceptions.ProtocolError) as exc:
                raise StreamGone(stream_id) from exc
            self.flush()
            waiter = self.loop.create_future()
            self._window_waiters[stream_id] = waiter
            await waiter
        self.flush()
        await self._drain()

    def end_stream(self, stream_id: int) -> None:
        """End a streamed body (an empty DATA frame with END_STREAM)."""
        if self.transport is None:
            raise StreamGone(stream_id)
        try:
            self.conn.end_stream(stream_id)
        except (h2.exceptions.StreamClosedError, h2.exceptions.ProtocolError) as exc:
            raise StreamGone(stream_id) from exc
        self.flush_stream_end()

    # -- idle ----------------------------------------------------------------------------
    def _arm_idle(self, delay: float) -> None:
        if self.limits.idle_timeout > 0:
            self._idle_timer = self.loop.call_later(delay, self._idle_check)

    def _idle_check(self) -> None:
        if self.transport is None:
            return
        idle_for = self.loop.time() - self._last_active
        if self.active_streams == 0 and idle_for >= self.limits.idle_timeout:
            log.debug("closing idle connection to %s after %.0f s", self.peername, idle_for)
            self.close()
            return
        self._arm_idle(max(self.limits.idle_timeout - idle_for, 1.0) if self.active_streams == 0
                       else self.limits.idle_timeout)


def ack(conn: h2.connection.H2Connection, event: h2.events.DataReceived) -> None:
    """Return received bytes to the peer's window (they are buffered under the body bound)."""
    if event.flow_controlled_length:
        try:
            conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
        except h2.exceptions.StreamClosedError:
            pass  # the stream was reset meanwhile: the connection window was credited by h2


def transport_error(exc: BaseException) -> TransportError:
    return exc if isinstance(exc, TransportError) else TransportError(f"{type(exc).__name__}: {exc}")
