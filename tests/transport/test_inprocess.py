"""The in-process transport (sdcp_fast/transport/inprocess.py): requests reach the handler
registered for a base URI with the caller's configured identity as the peer, as bytes."""

from __future__ import annotations

import asyncio

import pytest

from sdcp_fast.protocol.peer import Peer, PeerRole
from sdcp_fast.transport.base import Request, Response
from sdcp_fast.transport.inprocess import InProcessNetwork, Unreachable

VERIFIER = "inproc://verifier/"
DRAFTER = Peer("inproc://drafter/a/", PeerRole.DRAFTER)


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 10.0))


class Echo:
    def __init__(self):
        self.requests: list[Request] = []

    async def __call__(self, request: Request) -> Response:
        self.requests.append(request)
        return Response(200, request.body[::-1], {"content-type": "application/octet-stream"})


def test_the_handler_gets_the_callers_identity_and_the_request_as_sent():
    """The peer is the identity the caller's view was configured with (the in-process stand-in
    for the client certificate); headers are lower-cased; the body is a private bytes copy."""
    network = InProcessNetwork()
    echo = Echo()
    network.register(VERIFIER, echo)
    body = bytearray(b"abc")

    async def scenario():
        t = network.transport(DRAFTER)
        response = await t.request(VERIFIER, "POST", "proposals", body=body, query={"from": "3"},
                                   headers={"Content-Type": "application/sdcp+cbor"})
        body[0] = ord("z")  # the caller reusing its buffer does not change what was sent
        other = await network.transport(Peer(None, None)).request(VERIFIER.rstrip("/"), "GET", "x")
        return response, other

    response, other = run(scenario())
    first, second = echo.requests
    assert (first.method, first.path, dict(first.query), first.body) == ("POST", "proposals", {"from": "3"}, b"abc")
    assert isinstance(first.body, bytes)
    assert dict(first.headers) == {"content-type": "application/sdcp+cbor"}
    assert first.peer == DRAFTER and second.peer == Peer(None, None)
    assert response.status == 200 and response.body == b"cba"
    assert other.status == 200  # a trailing slash does not make another instance


def test_an_unregistered_instance_is_unreachable_like_a_dead_peer():
    """A base URI nobody serves, or one taken down, fails as a connection error (§6.9: callers
    retry or fail over exactly as over the network)."""
    network = InProcessNetwork()
    network.register(VERIFIER, Echo())

    async def scenario():
        t = network.transport(DRAFTER)
        await t.request(VERIFIER, "GET", "x")
        network.unregister(VERIFIER + "/")
        with pytest.raises(ConnectionError) as exc:
            await t.request(VERIFIER, "GET", "x")
        with pytest.raises(Unreachable):
            await t.request("inproc://nobody/", "GET", "x")
        await t.close()
        return exc.value

    assert isinstance(run(scenario()), Unreachable)


def test_request_stream_gives_the_body_as_a_stream():
    network = InProcessNetwork()
    network.register(VERIFIER, Echo())

    async def chunks(stream):
        return b"".join([chunk async for chunk in stream])

    async def scenario():
        response = await network.transport(DRAFTER).request_stream(VERIFIER, "POST", "x", body=b"hello")
        assert response.body == b"" and response.stream is not None
        return await chunks(response.stream)

    assert run(scenario()) == b"olleh"


def test_a_timeout_bounds_the_wait_as_over_the_network():
    """The Transport interface's ``timeout``: no response in time is a TimeoutError and the
    handler is cancelled, as the HTTP/2 client resets the stream."""
    network = InProcessNetwork()
    cancelled = asyncio.Event()

    async def stuck(request: Request) -> Response:
        try:
            await asyncio.Event().wait()
        finally:
            cancelled.set()
        raise AssertionError("unreachable")

    network.register(VERIFIER, stuck)
    network.register("inproc://fast/", Echo())

    async def scenario():
        t = network.transport(DRAFTER)
        with pytest.raises(TimeoutError):
            await t.request(VERIFIER, "GET", "x", timeout=0.02)
        fast = await t.request("inproc://fast/", "POST", "x", body=b"ab", timeout=5.0)
        return cancelled.is_set(), fast.body

    assert run(scenario()) == (True, b"ba")
