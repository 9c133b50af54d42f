"""The HTTP/1.1 debugging adapter serves the same handler with the same peer identity."""

from __future__ import annotations

import json

import pytest

from sdcp_fast.transport.errors import TransportError
from sdcp_fast.transport.h2conn import Limits
from sdcp_fast.transport.http1 import Http1Transport, serve_http1
from sdcp_fast.transport.tls import client_context, server_context
from tests.transport.transport_util import CLIENT_URI, Certs, echo, run

HTTP11 = ("http/1.1",)


def test_same_handler_and_peer_over_http11_with_mtls(certs: Certs) -> None:
    async def scenario() -> tuple[dict[str, object], bytes, int, dict[str, object]]:
        ctx = server_context(*certs.pair("server"), certs.ca, alpn=HTTP11)
        async with await serve_http1(echo, "127.0.0.1", 0, ssl=ctx, limits=Limits(max_body=1024)) as server:
            base = f"https://127.0.0.1:{server.port}/"
            async with Http1Transport(client_context(*certs.pair("client"), certs.ca, alpn=HTTP11)) as client:
                who = await client.request(base, "GET", "whoami", query={"from": "2"})
                echoed = await client.request(base, "POST", "echo", body=b"\x01\x02")
                big = await client.request(base, "POST", "echo", body=b"x" * 2048)
                boom = await client.request(base, "POST", "boom", body=b"x")
            return json.loads(who.body), echoed.body, big.status, {"status": boom.status, "body": boom.body,
                                                                  "type": boom.content_type}

    who, echoed, big_status, boom = run(scenario())
    assert who["peer"] == {"uri": CLIENT_URI, "role": "drafter"} and who["query"] == {"from": "2"}
    assert who["path"] == "whoami"
    assert echoed == b"\x01\x02" and big_status == 413
    assert boom["status"] == 500 and boom["type"] == "application/problem+json"
    assert b"secret" not in boom["body"] and b"Traceback" not in boom["body"]  # type: ignore[operator]


def test_client_without_certificate_is_refused(certs: Certs, foreign_certs: Certs) -> None:
    async def scenario() -> None:
        ctx = server_context(*certs.pair("server"), certs.ca, alpn=HTTP11)
        async with await serve_http1(echo, "127.0.0.1", 0, ssl=ctx) as server:
            foreign = client_context(*foreign_certs.pair("client"), certs.ca, alpn=HTTP11)
            async with Http1Transport(foreign) as client:
                with pytest.raises(TransportError):
                    await client.request(f"https://127.0.0.1:{server.port}/", "GET", "whoami", timeout=5)

    run(scenario())


def test_insecure_http11_binds_loopback_only() -> None:
    async def scenario() -> None:
        with pytest.raises(ValueError, match="loopback"):
            await serve_http1(echo, "0.0.0.0", 0, ssl=None, insecure=True)
        with pytest.raises(ValueError, match="SSL context"):
            await serve_http1(echo, "127.0.0.1", 0, ssl=None)

    run(scenario())
