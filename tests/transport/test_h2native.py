"""sdcp_fast.transport.h2native: which HTTP/2 implementation a connection gets and why, and
nghttp2's connection speaking to h2's (an independent implementation) without sockets. The
transport's own tests run on both implementations (conftest: ids py-h2, c-h2)."""

from __future__ import annotations

import os

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings
import pytest
from h2.errors import ErrorCodes

from sdcp_fast.transport import h2native

needs_native = pytest.mark.skipif(not h2native.available(), reason=h2native.status())


@pytest.fixture
def missing(monkeypatch: pytest.MonkeyPatch) -> None:
    """As on a machine where sdcp_fast._h2 was not built."""
    monkeypatch.setattr(h2native, "_load", lambda: (None, "native HTTP/2 (sdcp_fast._h2) is missing (test)"))
    monkeypatch.delenv("SDCP_H2", raising=False)
    monkeypatch.delenv("SDCP_REQUIRE_NATIVE_H2", raising=False)


def test_native_http2_is_built_where_ci_requires_it() -> None:
    if os.environ.get("SDCP_REQUIRE_NATIVE_H2") == "1":
        assert h2native.available(), h2native.status()
    assert h2native.status().startswith("loaded (nghttp2 ") == h2native.available()


def test_without_the_build_the_pure_python_path_is_used_and_says_why(missing: None) -> None:
    assert h2native.implementation() == h2native.PY
    assert h2native.native_connection(client_side=False) is None
    assert "missing" in h2native.status()


def test_asking_for_native_without_the_build_is_an_error(missing: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SDCP_H2", "c")
    with pytest.raises(ImportError, match="missing"):
        h2native.implementation()
    monkeypatch.setenv("SDCP_H2", "")
    monkeypatch.setenv("SDCP_REQUIRE_NATIVE_H2", "1")
    with pytest.raises(ImportError, match="missing"):
        h2native.implementation()


def test_environment_picks_the_implementation(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SDCP_H2", "py")
    assert h2native.implementation() == h2native.PY
    monkeypatch.delenv("SDCP_H2")
    assert h2native.implementation() == (h2native.C if h2native.available() else h2native.PY)
    with pytest.raises(ValueError):
        h2native.use("quic")


# -- nghttp2 against h2, sans I/O ------------------------------------------------------------

def _h2(client_side: bool) -> h2.connection.H2Connection:
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=client_side, header_encoding=None))
    conn.initiate_connection()
    return conn


def _native(client_side: bool) -> h2native.NativeConnection:
    conn = h2native.NativeConnection(client_side)
    conn.local_settings = {4: 1 << 20, 3: 8}  # INITIAL_WINDOW_SIZE, MAX_CONCURRENT_STREAMS
    conn.initiate_connection()
    return conn


def _pump(a: object, b: object) -> tuple[list[h2.events.Event], list[h2.events.Event]]:
    """Exchange bytes until both sides are quiet; the events each side saw."""
    seen_a: list[h2.events.Event] = []
    seen_b: list[h2.events.Event] = []
    for _ in range(20):
        out_a, out_b = a.data_to_send(), b.data_to_send()  # type: ignore[attr-defined]
        if not out_a and not out_b:
            break
        if out_a:
            seen_b += b.receive_data(out_a)  # type: ignore[attr-defined]
        if out_b:
            seen_a += a.receive_data(out_b)  # type: ignore[attr-defined]
    return seen_a, seen_b


def _of(events: list[h2.events.Event], kind: type) -> list:
    return [e for e in events if isinstance(e, kind)]


REQUEST = [(":method", "POST"), (":path", "/echo"), (":scheme", "https"), (":authority", "a"), ("x-k", "v")]


@needs_native
def test_native_server_answers_an_h2_client() -> None:
    client, server = _h2(True), _native(False)
    _pump(client, server)
    assert client.remote_settings.max_concurrent_streams == 8
    sid = client.get_next_available_stream_id()
    client.send_headers(sid, REQUEST)
    for offset in range(0, 60_000, 15_000):
        client.send_data(sid, b"x" * 15_000, end_stream=offset == 45_000)
    _, got = _pump(client, server)
    (request,) = _of(got, h2.events.RequestReceived)
    assert (b"x-k", b"v") in request.headers and not request.stream_ended
    body = b"".join(e.data for e in _of(got, h2.events.DataReceived))
    assert body == b"x" * 60_000 and _of(got, h2.events.StreamEnded)[0].stream_id == sid
    server.acknowledge_received_data(len(body), sid)
    server.send_headers(sid, [(":status", "200")])
    window = server.local_flow_control_window(sid)
    server.send_data(sid, b"y" * window)
    assert server.local_flow_control_window(sid) == 0
    seen, _ = _pump(client, server)
    assert sum(len(e.data) for e in _of(seen, h2.events.DataReceived)) == window
    for event in _of(seen, h2.events.DataReceived):
        client.acknowledge_received_data(event.flow_controlled_length, sid)
    _, got = _pump(client, server)
    assert _of(got, h2.events.WindowUpdated) and server.local_flow_control_window(sid) > 0
    server.end_stream(sid)
    seen, _ = _pump(client, server)
    assert _of(seen, h2.events.StreamEnded)
    assert server.streams.get(sid) is None
    with pytest.raises(h2.exceptions.StreamClosedError):
        server.send_data(sid, b"late")


@needs_native
def test_native_client_talks_to_an_h2_server_and_sees_resets_and_goaway() -> None:
    client, server = _native(True), _h2(False)
    _pump(client, server)
    first = client.get_next_available_stream_id()
    client.send_headers(first, REQUEST, end_stream=True)
    second = client.get_next_available_stream_id()
    assert second == first + 2
    client.send_headers(second, REQUEST, end_stream=True)
    _, got = _pump(client, server)
    assert [e.stream_id for e in _of(got, h2.events.RequestReceived)] == [first, second]
    server.send_headers(first, [(":status", "204")], end_stream=True)
    server.reset_stream(second, ErrorCodes.REFUSED_STREAM)
    seen, _ = _pump(client, server)
    (response,) = _of(seen, h2.events.ResponseReceived)
    assert response.headers == [(b":status", b"204")] and response.stream_ended is not None
    (reset,) = _of(seen, h2.events.StreamReset)
    assert (reset.stream_id, reset.error_code, reset.remote_reset) == (second, ErrorCodes.REFUSED_STREAM, True)
    server.close_connection(last_stream_id=second)
    seen, _ = _pump(client, server)
    (goaway,) = _of(seen, h2.events.ConnectionTerminated)
    assert (goaway.error_code, goaway.last_stream_id) == (ErrorCodes.NO_ERROR, second)


@needs_native
def test_native_server_refuses_streams_past_its_limit_alone() -> None:
    server = h2native.NativeConnection(False)
    server.local_settings = {3: 2}
    server.initiate_connection()
    client = _h2(True)
    _pump(client, server)
    assert client.remote_settings.max_concurrent_streams == 2
    client.remote_settings.update({3: 10})  # a client ignoring the limit, after acknowledging it
    client.remote_settings.acknowledge()
    ids = []
    for _ in range(3):
        ids.append(client.get_next_available_stream_id())
        client.send_headers(ids[-1], REQUEST, end_stream=True)
    seen, got = _pump(client, server)
    assert [e.stream_id for e in _of(got, h2.events.RequestReceived)] == ids[:2]
    (reset,) = _of(seen, h2.events.StreamReset)
    assert (reset.stream_id, reset.error_code) == (ids[2], ErrorCodes.REFUSED_STREAM)
    assert not _of(seen, h2.events.ConnectionTerminated)


@needs_native
def test_garbage_is_a_protocol_error_with_a_goaway() -> None:
    server = _native(False)
    with pytest.raises(h2.exceptions.ProtocolError):
        server.receive_data(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
    assert server.data_to_send()  # GOAWAY (or at least our SETTINGS) still goes out


# -- whole messages and one-call sends -----------------------------------------------------

def _whole_server() -> h2native.NativeConnection:
    conn = h2native.NativeConnection(False, whole_messages=True)
    conn.local_settings = {4: 1 << 20, 3: 8}
    conn.initiate_connection()
    return conn


@needs_native
def test_a_request_received_whole_is_one_event_with_its_bytes_returned() -> None:
    client, server = _h2(True), _whole_server()
    _pump(client, server)
    bodyless = client.get_next_available_stream_id()
    client.send_headers(bodyless, REQUEST, end_stream=True)
    sid = client.get_next_available_stream_id()
    client.send_headers(sid, REQUEST)
    for part in b"abc":
        client.send_data(sid, bytes([part]) * 16_000)
    client.send_data(sid, b"d" * 10_000, end_stream=True)
    assert client.outbound_flow_control_window == 65_535 - 58_000
    got = server.receive_data(client.data_to_send())
    assert [type(e) for e in got] == [h2native.WholeMessage, h2native.WholeMessage]
    body = b"a" * 16_000 + b"b" * 16_000 + b"c" * 16_000 + b"d" * 10_000
    assert [(e.stream_id, e.data) for e in got] == [(bodyless, b""), (sid, body)]
    assert (b"x-k", b"v") in got[1].headers
    _pump(client, server)  # the server's WINDOW_UPDATE: the body's bytes are the client's to send again
    assert client.outbound_flow_control_window == 65_535


@needs_native
def test_a_request_split_over_reads_comes_as_the_usual_events() -> None:
    client, server = _h2(True), _whole_server()
    _pump(client, server)
    sid = client.get_next_available_stream_id()
    client.send_headers(sid, REQUEST)
    client.send_data(sid, b"x" * 1000)
    first = server.receive_data(client.data_to_send())
    assert [type(e) for e in first] == [h2.events.RequestReceived, h2.events.DataReceived]
    assert first[1].data == b"x" * 1000 and first[1].flow_controlled_length == 1000
    client.send_data(sid, b"y" * 10, end_stream=True)
    second = server.receive_data(client.data_to_send())
    assert [type(e) for e in second] == [h2.events.DataReceived, h2.events.StreamEnded]


@needs_native
def test_a_reset_or_goaway_after_an_unfinished_request_keeps_its_place() -> None:
    client, server = _h2(True), _whole_server()
    _pump(client, server)
    sid = client.get_next_available_stream_id()
    client.send_headers(sid, REQUEST)
    client.send_data(sid, b"x" * 10)
    client.reset_stream(sid, ErrorCodes.CANCEL)
    got = server.receive_data(client.data_to_send())
    assert [type(e) for e in got] == [h2.events.RequestReceived, h2.events.DataReceived, h2.events.StreamReset]
    other = client.get_next_available_stream_id()
    client.send_headers(other, REQUEST)
    client.close_connection()
    got = server.receive_data(client.data_to_send())
    assert [type(e) for e in got] == [h2.events.RequestReceived, h2.events.ConnectionTerminated]


@needs_native
def test_send_message_sends_headers_body_and_end_at_once_when_the_windows_allow() -> None:
    client, server = _h2(True), _whole_server()
    _pump(client, server)
    small = client.get_next_available_stream_id()
    client.send_headers(small, REQUEST, end_stream=True)
    large = client.get_next_available_stream_id()
    client.send_headers(large, REQUEST, end_stream=True)
    _pump(client, server)
    assert server.send_message(small, [(":status", "200"), ("content-length", "5")], b"hello")
    assert not server.send_message(large, [(":status", "200")], b"z" * 70_000)  # over the 65,535 window
    seen, _ = _pump(client, server)
    assert [(e.stream_id, e.headers[0]) for e in _of(seen, h2.events.ResponseReceived)] == \
        [(small, (b":status", b"200")), (large, (b":status", b"200"))]
    assert [e.data for e in _of(seen, h2.events.DataReceived)] == [b"hello"]
    assert [e.stream_id for e in _of(seen, h2.events.StreamEnded)] == [small]
    assert server.streams.get(small) is None and server.streams.get(large) is not None
    with pytest.raises(h2.exceptions.StreamClosedError):
        server.send_message(small, [(":status", "200")], b"late")


@needs_native
def test_a_native_client_gets_a_whole_response_and_sends_a_request_in_one_call() -> None:
    client, server = h2native.NativeConnection(True, whole_messages=True), _h2(False)
    client.initiate_connection()
    _pump(client, server)
    sid = client.get_next_available_stream_id()
    assert client.send_message(sid, REQUEST, b"ping")
    _, got = _pump(client, server)
    assert [e.data for e in _of(got, h2.events.DataReceived)] == [b"ping"] and _of(got, h2.events.StreamEnded)
    server.send_headers(sid, [(":status", "200")])
    server.send_data(sid, b"pong", end_stream=True)
    (response,) = client.receive_data(server.data_to_send())
    assert isinstance(response, h2native.WholeMessage)
    assert (response.stream_id, response.headers, response.data) == (sid, [(b":status", b"200")], b"pong")


@needs_native
def test_a_request_held_back_by_the_stream_limit_goes_out_with_its_body_later() -> None:
    """At the server's limit of concurrent streams nghttp2 holds a new request back and opens
    its stream when one closes: the body goes with it then. (Sent apart from its headers, the
    body once found no stream, and the held-back headers later opened a stream with no body
    that stayed open at both ends, until such streams filled the connection.)"""
    client = h2native.NativeConnection(True)
    client.initiate_connection()
    server = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False, header_encoding=None))
    server.initiate_connection()
    server.update_settings({h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: 2})
    _pump(client, server)
    first = client.get_next_available_stream_id()
    client.send_message(first, REQUEST, b"")
    second = client.get_next_available_stream_id()
    client.send_message(second, REQUEST, b"")
    _pump(client, server)
    held = client.get_next_available_stream_id()
    body = b"q" * 100_000  # over the 65,535 initial window too
    assert client.send_message(held, REQUEST, body)  # queued whole, no StreamClosedError
    _, got = _pump(client, server)
    assert not _of(got, h2.events.RequestReceived)  # still held back
    server.send_headers(first, [(":status", "200")], end_stream=True)
    _, got = _pump(client, server)
    assert [e.stream_id for e in _of(got, h2.events.RequestReceived)] == [held]
    received = b"".join(e.data for e in _of(got, h2.events.DataReceived) if e.stream_id == held)
    for e in _of(got, h2.events.DataReceived):
        server.acknowledge_received_data(e.flow_controlled_length, e.stream_id)
    _, more = _pump(client, server)
    received += b"".join(e.data for e in _of(more, h2.events.DataReceived) if e.stream_id == held)
    assert received == body
    assert [e.stream_id for e in _of(got + more, h2.events.StreamEnded)] == [held]
