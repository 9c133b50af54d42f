"""The HTTP/2 client: connection reuse, concurrent streams, large bodies, timeouts, failures."""

from __future__ import annotations

import asyncio
import json
import socket

import pytest

from sdcp_fast.transport.base import Request, Response
from sdcp_fast.transport.errors import TransportError, TransportTimeout
from sdcp_fast.transport.h2client import H2Transport
from sdcp_fast.transport.h2conn import Limits
from sdcp_fast.transport.h2server import serve
from sdcp_fast.transport.nativeclient import h2_client
from sdcp_fast.transport.tls import client_context, server_context
from tests.transport.transport_util import Certs, echo, run

MiB = 1 << 20


def _client(certs: Certs, **kwargs) -> H2Transport:  # type: ignore[no-untyped-def]
    return h2_client(client_context(*certs.pair("client"), certs.ca), **kwargs)


async def _serve(handler, certs: Certs, **kwargs):  # type: ignore[no-untyped-def]
    return await serve(handler, "127.0.0.1", 0, ssl=server_context(*certs.pair("server"), certs.ca), **kwargs)


def test_100_concurrent_requests_share_one_connection(certs: Certs) -> None:
    in_flight = [0, 0]  # now, most at once

    async def scenario() -> tuple[list[Response], int, int]:
        everyone = asyncio.Event()

        async def held(request: Request) -> Response:
            in_flight[0] += 1
            in_flight[1] = max(in_flight)
            if in_flight[0] == 100:
                everyone.set()
            await asyncio.wait_for(everyone.wait(), 20)  # hold every stream open until all arrived
            in_flight[0] -= 1
            return Response(200, request.body)

        async with await _serve(held, certs) as server, _client(certs) as client:
            base = f"https://127.0.0.1:{server.port}/"
            responses = await asyncio.gather(*(client.request(base, "POST", f"r/{i}", body=str(i).encode())
                                               for i in range(100)))
            return responses, server.accepted, client.connections

    responses, accepted, pooled = run(scenario())
    assert [r.body for r in responses] == [str(i).encode() for i in range(100)]
    assert accepted == 1 and pooled == 1
    assert in_flight[1] == 100


def test_more_requests_than_the_servers_stream_limit_wait_for_a_stream(certs: Certs) -> None:
    async def scenario() -> list[bytes]:
        async with await _serve(echo, certs, limits=Limits(max_streams=4)) as server, _client(certs) as client:
            base = f"https://127.0.0.1:{server.port}/"
            return [r.body for r in await asyncio.gather(
                *(client.request(base, "POST", "e", body=b"%d" % i) for i in range(50)))]

    assert run(scenario()) == [b"%d" % i for i in range(50)]


def test_32_mib_bodies_each_way(certs: Certs) -> None:
    request_body = bytes(range(256)) * (32 * MiB // 256)
    seen = []

    async def reverse(request: Request) -> Response:
        seen.append(len(request.body))
        return Response(200, request.body[::-1])

    async def scenario() -> Response:
        async with await _serve(reverse, certs) as server, _client(certs) as client:
            return await client.request(f"https://127.0.0.1:{server.port}/", "POST", "big",
                                        body=request_body, timeout=60)

    response = run(scenario())
    assert seen == [32 * MiB]
    assert response.status == 200 and response.body == request_body[::-1]


def test_large_bodies_concurrently_with_small_requests(certs: Certs) -> None:
    async def scenario() -> tuple[list[int], list[bytes]]:
        async with await _serve(echo, certs) as server, _client(certs) as client:
            base = f"https://127.0.0.1:{server.port}/"
            big = [client.request(base, "POST", "big", body=bytes([i]) * (6 * MiB), timeout=60) for i in range(3)]
            small = [client.request(base, "POST", "small", body=b"s%d" % i) for i in range(20)]
            results = await asyncio.gather(*big, *small)
            return [len(r.body) for r in results[:3]], [r.body for r in results[3:]]

    sizes, small = run(scenario())
    assert sizes == [6 * MiB] * 3 and small == [b"s%d" % i for i in range(20)]


def test_response_over_the_client_bound_fails_cleanly(certs: Certs) -> None:
    async def scenario() -> bytes:
        async with await _serve(echo, certs) as server:
            base = f"https://127.0.0.1:{server.port}/"
            client = _client(certs, limits=Limits(max_body=1024))
            async with client:
                with pytest.raises(TransportError, match="over 1024"):
                    await client.request(base, "POST", "e", body=b"x" * 4096)
                return (await client.request(base, "POST", "e", body=b"fine")).body

    assert run(scenario()) == b"fine"


def test_timeout_cancels_the_stream_and_the_connection_stays_usable(certs: Certs) -> None:
    async def sleepy(request: Request) -> Response:
        if request.path == "slow":
            await asyncio.sleep(2)
        return Response(200, b"ok")

    async def scenario() -> bytes:
        async with await _serve(sleepy, certs) as server, _client(certs) as client:
            base = f"https://127.0.0.1:{server.port}/"
            with pytest.raises(TransportTimeout):
                await client.request(base, "GET", "slow", timeout=0.2)
            assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]
            return (await client.request(base, "GET", "fast", timeout=5)).body

    assert run(scenario()) == b"ok"


def test_refused_connection_is_a_transport_error() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again below: nothing listens there

    async def scenario() -> None:
        async with h2_client(insecure=True) as client:
            with pytest.raises(TransportError, match="cannot connect") as caught:
                await client.request(f"http://127.0.0.1:{port}/", "GET", "x", timeout=5)
            assert not isinstance(caught.value, TransportTimeout)

    run(scenario())


def test_server_closing_fails_nothing_in_flight_and_a_new_server_is_reached(certs: Certs) -> None:
    started = asyncio.Event

    async def scenario() -> tuple[bytes, bytes]:
        gate = started()

        async def waiting(request: Request) -> Response:
            gate.set()
            await asyncio.sleep(0.2)
            return Response(200, b"finished")

        server = await _serve(waiting, certs)
        port = server.port
        async with _client(certs) as client:
            base = f"https://127.0.0.1:{port}/"
            in_flight = asyncio.ensure_future(client.request(base, "GET", "x"))
            await gate.wait()
            server.close()  # GOAWAY: the stream in flight still completes
            await server.wait_closed()
            first = (await in_flight).body
            with pytest.raises(TransportError):
                await client.request(base, "GET", "x", timeout=5)
            async with await serve(echo, "127.0.0.1", port, ssl=server_context(*certs.pair("server"), certs.ca)):
                second = (await client.request(base, "POST", "x", body=b"back")).body
            return first, second

    assert run(scenario()) == (b"finished", b"back")


def test_https_needs_a_context_and_http_needs_insecure() -> None:
    async def scenario() -> None:
        async with h2_client() as client:
            with pytest.raises(TransportError, match="SSL context"):
                await client.request("https://127.0.0.1:1/", "GET", "x")
            with pytest.raises(TransportError, match="insecure"):
                await client.request("http://127.0.0.1:1/", "GET", "x")

    run(scenario())


def test_a_shorter_timeout_after_a_longer_one_fires_on_time(certs: Certs) -> None:
    async def held(request: Request) -> Response:
        await asyncio.sleep(60 if request.path == "long" else 30)
        return Response(200, b"late")

    async def scenario() -> None:
        async with await _serve(held, certs) as server, _client(certs) as client:
            base = f"https://127.0.0.1:{server.port}/"
            long = asyncio.ensure_future(client.request(base, "GET", "long", timeout=50))
            await asyncio.sleep(0.05)
            # Shorter than the first request's limit, on the same connection: fails at its own.
            with pytest.raises(TransportTimeout, match="GET .*short: no response within 0.2 s"):
                await asyncio.wait_for(client.request(base, "GET", "short", timeout=0.2), 20)
            assert not long.done()
            long.cancel()
            with pytest.raises(asyncio.CancelledError):
                await long

    run(scenario())


def test_repeated_paths_and_queries_reach_the_server_as_sent(certs: Certs) -> None:
    async def scenario() -> list[tuple[str, dict[str, str], str | None]]:
        async with await _serve(echo, certs) as server, _client(certs) as client:
            base = f"https://127.0.0.1:{server.port}/"
            seen = []
            for query, headers in (({"from": "3"}, {"X-Seq": "1"}), ({"from": "4"}, None),
                                   ({"x": "a b/c", "y": "é"}, {"host": "evil", "Content-Length": "9"}), (None, {})):
                response = await client.request(base, "GET", "whoami", query=query, headers=headers)
                info = json.loads(response.body)
                seen.append((info["path"], info["query"], info["headers"].get("x-seq")))
                assert "evil" not in response.body.decode()
            return seen

    assert run(scenario()) == [("whoami", {"from": "3"}, "1"), ("whoami", {"from": "4"}, None),
                               ("whoami", {"x": "a b/c", "y": "é"}, None), ("whoami", {}, None)]
