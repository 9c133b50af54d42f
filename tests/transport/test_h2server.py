"""The HTTP/2 + mTLS server over real loopback sockets, seen from our client and from curl."""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import ssl
import subprocess

import pytest

from sdcp_fast.transport.base import Request, Response
from sdcp_fast.transport.errors import TransportError
from sdcp_fast.transport.h2client import H2Transport
from sdcp_fast.transport.h2conn import Limits
from sdcp_fast.transport.h2server import serve
from sdcp_fast.transport.tls import client_context, server_context
from tests.transport.transport_util import CLIENT_URI, Certs, echo, run

MiB = 1 << 20


def _server_ctx(certs: Certs) -> ssl.SSLContext:
    return server_context(*certs.pair("server"), certs.ca)


def _client(certs: Certs, **kwargs: object) -> H2Transport:
    return H2Transport(client_context(*certs.pair("client"), certs.ca), **kwargs)  # type: ignore[arg-type]


def test_round_trip_carries_method_path_query_headers_and_peer(certs: Certs) -> None:
    async def scenario() -> dict[str, object]:
        async with await serve(echo, "127.0.0.1", 0, ssl=_server_ctx(certs)) as server, _client(certs) as client:
            base = f"https://127.0.0.1:{server.port}/"
            assert (await client.request(base, "POST", "echo", body=b"\x00cbor")).body == b"\x00cbor"
            response = await client.request(base, "GET", "whoami", query={"from": "3", "x": "a b/c"},
                                            headers={"X-Trace": "t1"})
            assert response.status == 200 and response.content_type == "application/json"
            return json.loads(response.body)

    info = run(scenario())
    assert info["method"] == "GET" and info["path"] == "whoami"
    assert info["query"] == {"from": "3", "x": "a b/c"}
    assert info["headers"]["x-trace"] == "t1"  # type: ignore[index]
    # The handler sees the client certificate's identity (URI SANs).
    assert info["peer"] == {"uri": CLIENT_URI, "role": "drafter"}


def test_alpn_is_h2_and_tls_is_1_3(certs: Certs) -> None:
    async def scenario() -> tuple[str | None, str | None]:
        async with await serve(echo, "127.0.0.1", 0, ssl=_server_ctx(certs)) as server, _client(certs) as client:
            await client.request(f"https://127.0.0.1:{server.port}/", "GET", "x")
            (connection,) = client._connections.values()
            tls = connection.transport.get_extra_info("ssl_object")  # type: ignore[union-attr]
            return tls.selected_alpn_protocol(), tls.version()

    assert run(scenario()) == ("h2", "TLSv1.3")


def test_client_offering_only_http11_gets_no_service(certs: Certs) -> None:
    async def scenario() -> int:
        async with await serve(echo, "127.0.0.1", 0, ssl=_server_ctx(certs)) as server:
            ctx = client_context(*certs.pair("client"), certs.ca, alpn=("http/1.1",))
            async with H2Transport(ctx) as client:
                with pytest.raises(TransportError):
                    await client.request(f"https://127.0.0.1:{server.port}/", "GET", "x", timeout=5)
            return server.accepted

    assert run(scenario()) == 0


def _no_cert_context(certs: Certs) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.load_verify_locations(certs.ca)
    ctx.set_alpn_protocols(["h2"])
    return ctx


@pytest.mark.parametrize("who", ["no certificate", "certificate from another CA"])
def test_client_without_a_trusted_certificate_is_refused_in_the_handshake(
        certs: Certs, foreign_certs: Certs, who: str) -> None:
    ctx = _no_cert_context(certs) if who == "no certificate" else \
        client_context(*foreign_certs.pair("client"), certs.ca)
    calls = []

    async def counting(request: Request) -> Response:
        calls.append(request)
        return await echo(request)

    async def scenario() -> int:
        async with await serve(counting, "127.0.0.1", 0, ssl=_server_ctx(certs)) as server:
            async with H2Transport(ctx) as client:
                with pytest.raises(TransportError):
                    await client.request(f"https://127.0.0.1:{server.port}/", "GET", "whoami", timeout=5)
            return server.accepted

    # TLS 1.3 finishes the client's side of the handshake before the server checks the
    # client certificate; the server then drops the connection, never completing its side.
    assert run(scenario()) == 0
    assert calls == []


def test_server_certificate_from_another_ca_is_refused_by_the_client(certs: Certs, foreign_certs: Certs) -> None:
    async def scenario() -> None:
        foreign = server_context(*foreign_certs.pair("client"), certs.ca)
        async with await serve(echo, "127.0.0.1", 0, ssl=foreign) as server, _client(certs) as client:
            with pytest.raises(TransportError, match="(?i)certificate"):
                await client.request(f"https://127.0.0.1:{server.port}/", "GET", "x", timeout=5)

    run(scenario())


def test_handler_exception_is_a_500_problem_without_traceback(certs: Certs, caplog: pytest.LogCaptureFixture
                                                              ) -> None:
    async def scenario() -> Response:
        async with await serve(echo, "127.0.0.1", 0, ssl=_server_ctx(certs)) as server, _client(certs) as client:
            return await client.request(f"https://127.0.0.1:{server.port}/", "POST", "boom", body=b"x")

    with caplog.at_level(logging.ERROR, logger="sdcp_fast.transport"):
        response = run(scenario())
    assert response.status == 500
    assert response.content_type == "application/problem+json"
    problem = json.loads(response.body)
    assert problem["status"] == 500 and problem["type"] == "about:blank" and problem["title"]
    assert b"Traceback" not in response.body and b"secret internal detail" not in response.body
    assert "secret internal detail" in caplog.text  # logged on the server side instead


def test_body_over_the_bound_is_a_413_problem_and_the_connection_stays_usable(certs: Certs) -> None:
    async def scenario() -> tuple[list[int], int]:
        limits = Limits(max_body=64 * 1024)
        async with await serve(echo, "127.0.0.1", 0, ssl=_server_ctx(certs), limits=limits) as server, \
                _client(certs) as client:
            base = f"https://127.0.0.1:{server.port}/"
            statuses = []
            for size in (64 * 1024, 64 * 1024 + 1, 8 * MiB):  # 8 MiB: far beyond every window
                response = await client.request(base, "POST", "echo", body=b"x" * size, timeout=10)
                statuses.append(response.status)
                if response.status == 413:
                    assert response.content_type == "application/problem+json"
                    assert json.loads(response.body)["status"] == 413
            statuses.append((await client.request(base, "POST", "echo", body=b"ok")).status)
            return statuses, len(client._connections)

    assert run(scenario()) == ([200, 413, 413, 200], 1)


def test_oversized_header_block_ends_the_connection_not_the_server(certs: Certs) -> None:
    async def scenario() -> int:
        limits = Limits(max_header_list=4096)
        async with await serve(echo, "127.0.0.1", 0, ssl=_server_ctx(certs), limits=limits) as server:
            base = f"https://127.0.0.1:{server.port}/"
            async with _client(certs) as client:
                with pytest.raises(TransportError):
                    await client.request(base, "GET", "x", headers={"x-big": "y" * 8192}, timeout=5)
            async with _client(certs) as client:
                return (await client.request(base, "GET", "x", headers={"x-small": "y"})).status

    assert run(scenario()) == 200


def test_base_path_is_stripped_and_other_paths_are_404(certs: Certs) -> None:
    async def scenario() -> tuple[dict[str, object], int]:
        async with await serve(echo, "127.0.0.1", 0, ssl=_server_ctx(certs), base_path="/sdcp/v1") as server, \
                _client(certs) as client:
            inside = await client.request(f"https://127.0.0.1:{server.port}/sdcp/v1/", "GET", "whoami")
            outside = await client.request(f"https://127.0.0.1:{server.port}/other/", "GET", "whoami")
            return json.loads(inside.body), outside.status

    info, status = run(scenario())
    assert info["path"] == "whoami" and status == 404


def test_idle_connections_are_closed_and_the_client_reconnects(certs: Certs) -> None:
    async def scenario() -> tuple[int, bool]:
        limits = Limits(idle_timeout=0.2)
        async with await serve(echo, "127.0.0.1", 0, ssl=_server_ctx(certs), limits=limits) as server, \
                _client(certs) as client:
            base = f"https://127.0.0.1:{server.port}/"
            await client.request(base, "GET", "x")
            (first,) = client._connections.values()
            await asyncio.sleep(1.5)
            closed = first.closed.done()
            assert (await client.request(base, "POST", "echo", body=b"again")).body == b"again"
            return server.accepted, closed

    assert run(scenario()) == (2, True)


def test_handler_is_not_cancelled_when_the_client_gives_up(certs: Certs) -> None:
    finished = []

    async def slow(request: Request) -> Response:
        await asyncio.sleep(0.3)
        finished.append(request.path)
        return Response(200)

    async def scenario() -> None:
        async with await serve(slow, "127.0.0.1", 0, ssl=_server_ctx(certs)) as server, _client(certs) as client:
            with pytest.raises(TimeoutError):
                await client.request(f"https://127.0.0.1:{server.port}/", "POST", "commit", timeout=0.05)
            await asyncio.sleep(0.6)

    run(scenario())
    assert finished == ["commit"]


def _curl_http2() -> str | None:
    curl = shutil.which("curl")
    if curl is None:
        return None
    features = subprocess.run([curl, "--version"], capture_output=True, text=True).stdout
    return curl if "HTTP2" in features else None


@pytest.mark.skipif(_curl_http2() is None, reason="needs curl with HTTP2 support on PATH")
def test_outside_client_curl_speaks_http2_with_client_certificate(certs: Certs, tmp_path) -> None:  # type: ignore[no-untyped-def]
    curl = _curl_http2()
    assert curl is not None
    payload = tmp_path / "body.bin"
    payload.write_bytes(bytes(range(256)) * 64)
    cert, key = certs.pair("client")

    async def scenario() -> tuple[list[str], bytes]:
        async with await serve(echo, "127.0.0.1", 0, ssl=_server_ctx(certs)) as server:
            base = f"https://127.0.0.1:{server.port}/"
            common = [curl, "-sS", "--http2", "--cacert", certs.ca, "--cert", cert, "--key", key]
            who = await asyncio.create_subprocess_exec(
                *common, "-w", "\n%{http_version}", f"{base}whoami?from=7", stdout=subprocess.PIPE)
            out, _ = await who.communicate()
            post = await asyncio.create_subprocess_exec(
                *common, "--data-binary", f"@{payload}", "-H", "content-type: application/sdcp+cbor",
                f"{base}echo", stdout=subprocess.PIPE)
            echoed, _ = await post.communicate()
            return out.decode().rsplit("\n", 1), echoed

    (body, version), echoed = run(scenario())
    assert version == "2"
    info = json.loads(body)
    assert info["peer"] == {"uri": CLIENT_URI, "role": "drafter"} and info["query"] == {"from": "7"}
    assert echoed == payload.read_bytes()


def test_same_behaviour_on_the_plain_asyncio_loop(certs: Certs) -> None:
    # The services run on uvloop when it is installed (transport.loop.run); the adapter must
    # not depend on it.
    async def scenario() -> tuple[bytes, dict[str, object], int]:
        async with await serve(echo, "127.0.0.1", 0, ssl=_server_ctx(certs),
                               limits=Limits(max_body=4 * MiB)) as server, _client(certs) as client:
            base = f"https://127.0.0.1:{server.port}/"
            big = await client.request(base, "POST", "echo", body=b"z" * (3 * MiB))
            who = await client.request(base, "GET", "whoami")
            refused = await client.request(base, "POST", "echo", body=b"z" * (5 * MiB))
            return big.body, json.loads(who.body), refused.status

    body, who, status = asyncio.run(scenario())
    assert body == b"z" * (3 * MiB) and who["peer"] == {"uri": CLIENT_URI, "role": "drafter"} and status == 413


def test_handler_letting_a_cancellation_out_resets_only_its_stream(certs: Certs) -> None:
    async def cancelled(request: Request) -> Response:
        if request.path == "cancel":
            raise asyncio.CancelledError
        return await echo(request)

    async def scenario() -> bytes:
        async with await serve(cancelled, "127.0.0.1", 0, ssl=_server_ctx(certs)) as server, \
                _client(certs) as client:
            base = f"https://127.0.0.1:{server.port}/"
            with pytest.raises(TransportError, match="reset"):
                await client.request(base, "GET", "cancel", timeout=5)
            return (await client.request(base, "POST", "echo", body=b"still here")).body

    assert run(scenario()) == b"still here"
