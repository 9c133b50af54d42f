"""The connection adapter without sockets: a plain h2 peer in memory, input one byte at a time."""

from __future__ import annotations

import asyncio

import h2.config
import h2.connection
import h2.events
from transport_util import echo, run

from sdcp_fast.transport.base import Response
from sdcp_fast.transport.h2client import _ClientProtocol
from sdcp_fast.transport.h2conn import Limits
from sdcp_fast.transport.h2server import H2Server, _ServerProtocol


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


def _peer(client_side: bool) -> h2.connection.H2Connection:
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=client_side, header_encoding=None))
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
