"""Streamed responses (``Response.stream``) over HTTP/2 + mTLS, HTTP/1.1 and in process: chunks
arrive as they are produced, large ones within flow control, and a client that leaves stops
the producer."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator

import aiohttp

from sdcp_fast.protocol.peer import Peer, PeerRole
from sdcp_fast.transport.base import Request, Response
from sdcp_fast.transport.h2client import H2Transport
from sdcp_fast.transport.h2server import serve
from sdcp_fast.transport.http1 import Http1Transport, serve_http1
from sdcp_fast.transport.inprocess import InProcessNetwork
from sdcp_fast.transport.tls import client_context, server_context
from tests.transport.transport_util import Certs, run

MiB = 1 << 20


class Producer:
    """A handler whose ``ticks`` response yields one chunk per ``release``; ``big`` yields
    large chunks at once; it records whether its iterator was closed."""

    def __init__(self) -> None:
        self.gate: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.closed = asyncio.Event()
        self.sent = 0

    async def ticks(self) -> AsyncIterator[bytes]:
        try:
            while (chunk := await self.gate.get()) is not None:
                self.sent += 1
                yield chunk
        finally:
            self.closed.set()

    @staticmethod
    async def big() -> AsyncIterator[bytes]:
        for i in range(6):
            yield bytes([i]) * (3 * MiB)  # over the 4 MiB stream window in two chunks

    async def __call__(self, request: Request) -> Response:
        if request.path == "big":
            return Response(200, headers={"content-type": "application/octet-stream"}, stream=self.big())
        if request.path == "plain":
            return Response(200, b"not streamed")
        return Response(200, headers={"content-type": "text/event-stream"}, stream=self.ticks())


def _contexts(certs: Certs, alpn: tuple[str, ...] = ("h2",)) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    return (server_context(*certs.pair("server"), certs.ca, alpn=alpn),
            client_context(*certs.pair("client"), certs.ca, alpn=alpn))


def test_h2_chunks_arrive_as_they_are_produced(certs: Certs) -> None:
    async def scenario() -> None:
        producer = Producer()
        server_ctx, client_ctx = _contexts(certs)
        async with await serve(producer, "127.0.0.1", 0, ssl=server_ctx) as server, H2Transport(client_ctx) as client:
            response = await client.request_stream(f"https://127.0.0.1:{server.port}/", "GET", "ticks")
            assert response.status == 200 and response.content_type == "text/event-stream"
            assert response.stream is not None
            chunks = response.stream.__aiter__()
            for i in range(3):
                await producer.gate.put(f"data: {i}\n\n".encode())
                # Each chunk is readable before the next one exists.
                assert await asyncio.wait_for(chunks.__anext__(), 5) == f"data: {i}\n\n".encode()
            await producer.gate.put(None)
            assert [c async for c in chunks] == []
            # The stream was freed: the connection carries an ordinary request after it.
            assert (await client.request(f"https://127.0.0.1:{server.port}/", "GET", "plain")).body == b"not streamed"

    run(scenario())


def test_h2_large_chunks_respect_flow_control(certs: Certs) -> None:
    async def scenario() -> None:
        server_ctx, client_ctx = _contexts(certs)
        async with await serve(Producer(), "127.0.0.1", 0, ssl=server_ctx) as server, \
                H2Transport(client_ctx) as client:
            base = f"https://127.0.0.1:{server.port}/"
            response = await client.request_stream(base, "GET", "big")
            assert response.stream is not None
            received = bytearray()
            async for chunk in response.stream:
                received += chunk
                await asyncio.sleep(0)  # a reader slower than the socket
            assert received == b"".join(bytes([i]) * (3 * MiB) for i in range(6))
            # A streamed response read by the plain client arrives whole.
            assert len((await client.request(base, "GET", "big")).body) == 18 * MiB

    run(scenario())


def test_h2_client_leaving_closes_the_producer(certs: Certs) -> None:
    async def scenario() -> None:
        producer = Producer()
        server_ctx, client_ctx = _contexts(certs)
        async with await serve(producer, "127.0.0.1", 0, ssl=server_ctx) as server, H2Transport(client_ctx) as client:
            response = await client.request_stream(f"https://127.0.0.1:{server.port}/", "GET", "ticks")
            assert response.stream is not None
            await producer.gate.put(b"one")
            chunks = response.stream.__aiter__()
            assert await chunks.__anext__() == b"one"
            await chunks.aclose()  # type: ignore[attr-defined]
            # The reset reaches the server, which closes the iterator while it waits.
            await asyncio.wait_for(producer.closed.wait(), 5)
            assert producer.sent == 1

    run(scenario())


def test_h2_connection_lost_closes_the_producer(certs: Certs) -> None:
    async def scenario() -> None:
        producer = Producer()
        server_ctx, client_ctx = _contexts(certs)
        async with await serve(producer, "127.0.0.1", 0, ssl=server_ctx) as server:
            client = H2Transport(client_ctx)
            response = await client.request_stream(f"https://127.0.0.1:{server.port}/", "GET", "ticks")
            assert response.stream is not None
            (connection,) = client._connections.values()
            assert connection.transport is not None
            connection.transport.abort()
            await asyncio.wait_for(producer.closed.wait(), 5)
            await client.close()

    run(scenario())


def test_http1_streams_chunked(certs: Certs) -> None:
    async def scenario() -> None:
        producer = Producer()
        server_ctx, client_ctx = _contexts(certs, alpn=("http/1.1",))
        async with await serve_http1(producer, "127.0.0.1", 0, ssl=server_ctx) as server, \
                aiohttp.ClientSession() as session:
            async with session.get(f"https://127.0.0.1:{server.port}/ticks", ssl=client_ctx) as reply:
                assert reply.headers["transfer-encoding"] == "chunked"
                for i in range(2):
                    await producer.gate.put(f"data: {i}\n\n".encode())
                    line = await asyncio.wait_for(reply.content.readuntil(b"\n\n"), 5)
                    assert line == f"data: {i}\n\n".encode()
            # Leaving the response drops the connection; the producer is closed.
            await asyncio.wait_for(producer.closed.wait(), 5)

    run(scenario())


def test_http1_client_reads_a_stream_incrementally(certs: Certs) -> None:
    async def scenario() -> None:
        producer = Producer()
        server_ctx, client_ctx = _contexts(certs, alpn=("http/1.1",))
        async with await serve_http1(producer, "127.0.0.1", 0, ssl=server_ctx) as server, \
                Http1Transport(client_ctx) as client:
            response = await client.request_stream(f"https://127.0.0.1:{server.port}/", "GET", "ticks")
            assert response.status == 200 and response.stream is not None
            chunks = response.stream.__aiter__()
            await producer.gate.put(b"first")
            assert await asyncio.wait_for(chunks.__anext__(), 5) == b"first"
            await producer.gate.put(None)
            assert [c async for c in chunks] == []

    run(scenario())


def test_inprocess_passes_the_iterator_through() -> None:
    async def scenario() -> None:
        producer = Producer()
        network = InProcessNetwork()
        network.register("inproc://p/", producer)
        transport = network.transport(Peer("inproc://c/", PeerRole.ROUTER))
        response = await transport.request_stream("inproc://p/", "GET", "ticks")
        assert response.stream is not None
        await producer.gate.put(b"a")
        await producer.gate.put(None)
        assert [c async for c in response.stream] == [b"a"]
        plain = await transport.request_stream("inproc://p/", "GET", "plain")
        assert plain.stream is not None and [c async for c in plain.stream] == [b"not streamed"]

    run(scenario())
