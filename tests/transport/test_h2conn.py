"""The connection adapter without sockets: a plain h2 peer in memory, input one byte at a time."""

from __future__ import annotations

import asyncio

import h2.config
import h2.connection
import h2.events
import pytest
from hyperframe.frame import GoAwayFrame

from sdcp_fast.transport.base import Response
from sdcp_fast.transport.errors import TransportError, TransportTimeout
from sdcp_fast.transport.h2client import _ClientProtocol
from sdcp_fast.transport.h2conn import Limits, _Connection
from sdcp_fast.transport.h2server import H2Server, _ServerProtocol
from tests.transport.transport_util import echo, run


class FakeTransport:
    def __init__(self) -> None:
        self.out = bytearray()
        self.closed = False

    def get_extra_info(self, name: str, default: object = None) -> object:
        return ("memory", 0) if name == "peername" else default

    def write(self, data: bytes) -> None:
        self.out += data

    def take(self) -> bytes:
        data, self.out = bytes(self.out), bytearray()
        return data

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    abort = close


def _peer(client_side: bool, graceful: bool = False) -> h2.connection.H2Connection:
    """A plain h2 peer; ``graceful``: one that keeps receiving after a NO_ERROR GOAWAY, as
    RFC 9113 allows and plain h2 does not (python-hyper/h2#1181)."""
    kind = _Connection if graceful else h2.connection.H2Connection
    conn = kind(h2.config.H2Configuration(client_side=client_side, header_encoding=None))
    conn.initiate_connection()
    return conn


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def test_server_adapter_fed_one_byte_at_a_time() -> None:
    async def scenario() -> list[h2.events.Event]:
        server = H2Server(echo, Limits(), "/")
        protocol, wire = _ServerProtocol(server), FakeTransport()
        protocol.connection_made(wire)  # type: ignore[arg-type]
        client = _peer(client_side=True)
        client.send_headers(1, [(":method", "POST"), (":scheme", "http"), (":authority", "x"),
                                (":path", "/echo?from=1")])
        client.send_data(1, b"\xa1\x00" * 5000, end_stream=True)
        data = client.data_to_send()
        for i in range(len(data)):
            protocol.data_received(data[i:i + 1])
        await _settle()
        return client.receive_data(wire.take())

    events = run(scenario())
    response = next(e for e in events if isinstance(e, h2.events.ResponseReceived))
    assert dict(response.headers)[b":status"] == b"200"
    body = b"".join(e.data for e in events if isinstance(e, h2.events.DataReceived))
    assert body == b"\xa1\x00" * 5000
    assert any(isinstance(e, h2.events.StreamEnded) for e in events)


def test_server_adapter_fed_whole_requests_bounds_their_bodies() -> None:
    """Requests in one read (nghttp2 hands each on as one event): answered, and a body over
    max_body without a content-length is refused as one arriving in pieces is."""
    async def scenario() -> dict[int, bytes]:
        server = H2Server(echo, Limits(max_body=1000), "/")
        protocol, wire = _ServerProtocol(server), FakeTransport()
        protocol.connection_made(wire)  # type: ignore[arg-type]
        client = _peer(client_side=True)
        for stream_id, size in ((1, 1000), (3, 1001), (5, 0)):
            client.send_headers(stream_id, [(":method", "POST"), (":scheme", "http"), (":authority", "x"),
                                            (":path", "/echo")], end_stream=not size)
            if size:
                client.send_data(stream_id, b"b" * size, end_stream=True)
        protocol.data_received(client.data_to_send())
        await _settle()
        statuses = {}
        for event in client.receive_data(wire.take()):
            if isinstance(event, h2.events.ResponseReceived):
                statuses[event.stream_id] = dict(event.headers)[b":status"]
        assert server.buffered == 0 and not protocol.streams
        return statuses

    assert run(scenario()) == {1: b"200", 3: b"413", 5: b"200"}


def test_client_adapter_fed_a_whole_response() -> None:
    async def scenario() -> Response:
        protocol, wire = _ClientProtocol(Limits()), FakeTransport()
        protocol.connection_made(wire)  # type: ignore[arg-type]
        server = _peer(client_side=False)
        exchange = asyncio.ensure_future(protocol.exchange(
            [(":method", "GET"), (":scheme", "https"), (":authority", "x"), (":path", "/output")], b""))
        await _settle()
        request = next(e for e in server.receive_data(wire.take()) if isinstance(e, h2.events.RequestReceived))
        server.send_headers(request.stream_id, [(":status", "200"), ("content-type", "application/sdcp+cbor")])
        server.send_data(request.stream_id, b"\xa0" * 700, end_stream=True)
        protocol.data_received(server.data_to_send())
        response = await exchange
        assert not protocol.pending and protocol.active_streams == 0
        return response

    response = run(scenario())
    assert response.status == 200 and response.body == b"\xa0" * 700
    assert response.content_type == "application/sdcp+cbor"


def test_client_adapter_fed_one_byte_at_a_time() -> None:
    async def scenario() -> tuple[Response, list[tuple[bytes, bytes]], bytes]:
        protocol, wire = _ClientProtocol(Limits()), FakeTransport()
        protocol.connection_made(wire)  # type: ignore[arg-type]
        server = _peer(client_side=False)
        exchange = asyncio.ensure_future(protocol.exchange(
            [(":method", "POST"), (":scheme", "https"), (":authority", "x"), (":path", "/proposals")], b"q" * 3000))
        await _settle()
        events = server.receive_data(wire.take())
        request = next(e for e in events if isinstance(e, h2.events.RequestReceived))
        received = b"".join(e.data for e in events if isinstance(e, h2.events.DataReceived))
        server.send_headers(request.stream_id, [(":status", "409"), ("content-type", "application/problem+json")])
        server.send_data(request.stream_id, b'{"status": 409}', end_stream=True)
        data = server.data_to_send()
        for i in range(len(data)):
            protocol.data_received(data[i:i + 1])
        return await exchange, request.headers, received

    response, headers, received = run(scenario())
    assert (b":path", b"/proposals") in headers and received == b"q" * 3000
    assert response.status == 409 and response.body == b'{"status": 409}'
    assert response.content_type == "application/problem+json"


def test_draining_server_refuses_new_streams_but_finishes_open_ones() -> None:
    async def scenario() -> list[h2.events.Event]:
        release = asyncio.Event()

        async def held(request):  # type: ignore[no-untyped-def]
            await release.wait()
            return Response(200, b"done")

        server = H2Server(held, Limits(), "/")
        protocol, wire = _ServerProtocol(server), FakeTransport()
        protocol.connection_made(wire)  # type: ignore[arg-type]
        client = _peer(client_side=True, graceful=True)
        fields = [(":method", "GET"), (":scheme", "http"), (":authority", "x"), (":path", "/a")]
        client.send_headers(1, fields, end_stream=True)
        protocol.data_received(client.data_to_send())
        await _settle()
        protocol.close()  # GOAWAY(last stream 1); stream 1 is still being handled
        client.send_headers(3, fields, end_stream=True)  # sent before the client saw the GOAWAY
        protocol.data_received(client.data_to_send())
        release.set()
        await _settle()
        assert wire.closed  # the last stream ended: the connection closes
        return client.receive_data(wire.take())

    events = run(scenario())
    goaway = next(e for e in events if isinstance(e, h2.events.ConnectionTerminated))
    assert goaway.last_stream_id == 1
    refused = next(e for e in events if isinstance(e, h2.events.StreamReset))
    assert refused.stream_id == 3 and refused.error_code == h2.errors.ErrorCodes.REFUSED_STREAM
    assert b"".join(e.data for e in events if isinstance(e, h2.events.DataReceived) and e.stream_id == 1) == b"done"


def test_client_marks_streams_above_goaway_retryable_and_finishes_the_rest() -> None:
    async def scenario() -> tuple[Response, BaseException | None, bool]:
        protocol, wire = _ClientProtocol(Limits()), FakeTransport()
        protocol.connection_made(wire)  # type: ignore[arg-type]
        server = _peer(client_side=False)
        fields = [(":method", "GET"), (":scheme", "https"), (":authority", "x"), (":path", "/")]
        first = asyncio.ensure_future(protocol.exchange(fields, b""))
        second = asyncio.ensure_future(protocol.exchange(fields, b""))
        await _settle()
        server.receive_data(wire.take())
        protocol.data_received(server.data_to_send())  # the server's SETTINGS
        # A graceful GOAWAY naming stream 1 as the last processed, then stream 1's response.
        # (h2 closes its own state on sending GOAWAY, so the peer here writes the frame raw.)
        goaway = GoAwayFrame(0)
        goaway.last_stream_id = 1
        protocol.data_received(goaway.serialize())
        usable_after_goaway = protocol.usable
        server.send_headers(1, [(":status", "200")])
        server.send_data(1, b"one", end_stream=True)
        protocol.data_received(server.data_to_send())
        await _settle()
        return await first, second.exception(), usable_after_goaway

    first, error, usable = run(scenario())
    assert first.status == 200 and first.body == b"one"
    assert error is not None and getattr(error, "retryable", False)
    assert not usable


def test_client_exchange_times_out_while_its_body_waits_for_a_window() -> None:
    async def scenario(streamed: bool) -> None:
        protocol, wire = _ClientProtocol(Limits()), FakeTransport()
        protocol.connection_made(wire)  # type: ignore[arg-type]
        fields = [(":method", "POST"), (":scheme", "https"), (":authority", "x"), (":path", "/proposals")]
        deadline = asyncio.get_running_loop().time() + 0.1
        # 200 kB against the initial 64 KiB window, which no peer ever opens.
        exchange = protocol.exchange(fields, b"q" * 200_000, streamed, deadline=deadline, limit=0.1)
        with pytest.raises(TransportTimeout, match="no response within 0.1 s"):
            await asyncio.wait_for(exchange, 30)
        assert not protocol.pending and protocol.active_streams == 0

    run(scenario(False))
    run(scenario(True))


def test_client_stops_a_streamed_requests_body_when_the_server_resets_it() -> None:
    async def scenario() -> None:
        protocol, wire = _ClientProtocol(Limits()), FakeTransport()
        protocol.connection_made(wire)  # type: ignore[arg-type]
        server = _peer(client_side=False)
        fields = [(":method", "POST"), (":scheme", "https"), (":authority", "x"), (":path", "/chunks")]
        # 200 kB against the initial 64 KiB window: the body waits for a WINDOW_UPDATE.
        exchange = asyncio.ensure_future(protocol.exchange(fields, b"q" * 200_000, True))
        await _settle()
        request = next(e for e in server.receive_data(wire.take()) if isinstance(e, h2.events.RequestReceived))
        server.reset_stream(request.stream_id, h2.errors.ErrorCodes.INTERNAL_ERROR)
        protocol.data_received(server.data_to_send())
        with pytest.raises(TransportError, match="reset by the server"):
            await asyncio.wait_for(exchange, 10)  # not held by the window, which never opens
        assert not protocol.pending and protocol.active_streams == 0

    run(scenario())
