"""Which server h2server.serve starts, and what only the native one does: whole requests
handed over in batches, one wake-up each (the shared behaviour is in test_h2server.py and
its neighbours, run against both servers)."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable, Coroutine, Mapping
from types import MappingProxyType
from typing import Any

import pytest

from sdcp_fast.protocol.peer import Peer
from sdcp_fast.transport import nativeserver
from sdcp_fast.transport.base import DirectHandler, Request, Response
from sdcp_fast.transport.errors import TransportError, TransportTimeout
from sdcp_fast.transport.h2client import H2Transport
from sdcp_fast.transport.h2server import H2Server, serve
from sdcp_fast.transport.tls import client_context, server_context
from tests.transport.transport_util import CLIENT_URI, Certs, run


def test_serve_starts_the_chosen_server(certs: Certs, server_impl: str) -> None:
    async def scenario() -> str:
        async with await serve(_ok, "127.0.0.1", 0, ssl=server_context(*certs.pair("server"), certs.ca)) as server:
            return type(server).__name__

    assert run(scenario()) == ("NativeServer" if server_impl == nativeserver.NATIVE else "H2Server")


def test_a_context_not_made_by_server_context_is_served_by_the_python_server(certs: Certs, server_impl: str
                                                                             ) -> None:
    # The native thread configures its TLS from server_context's files; of any other context
    # it knows nothing, so that one keeps Python's TLS.
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(*certs.pair("server"))

    async def scenario() -> bool:
        async with await serve(_ok, "127.0.0.1", 0, ssl=ctx) as server:
            return isinstance(server, H2Server)

    assert run(scenario())


def test_a_server_context_changed_after_it_was_made_is_served_by_the_python_server(certs: Certs,
                                                                                   server_impl: str) -> None:
    # The native thread takes only server_context's files: a context since allowed TLS 1.2, or
    # no longer requiring a client certificate, keeps Python's TLS, which honours the change.
    def tls12(ctx: ssl.SSLContext) -> None:
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2

    def optional_client(ctx: ssl.SSLContext) -> None:
        ctx.verify_mode = ssl.CERT_OPTIONAL

    async def scenario(change: Callable[[ssl.SSLContext], None]) -> bool:
        ctx = server_context(*certs.pair("server"), certs.ca)
        change(ctx)
        async with await serve(_ok, "127.0.0.1", 0, ssl=ctx) as server:
            return isinstance(server, H2Server)

    assert run(scenario(tls12)) and run(scenario(optional_client))


def test_unknown_server_name_is_an_error(monkeypatch: pytest.MonkeyPatch, server_impl: str) -> None:
    nativeserver.use(None)
    monkeypatch.setenv("SDCP_SERVER", "fast")
    with pytest.raises(ValueError, match="SDCP_SERVER"):
        nativeserver.implementation()
    monkeypatch.setenv("SDCP_SERVER", "py")
    assert nativeserver.implementation() == nativeserver.PY


def test_the_native_server_is_the_default_where_built(monkeypatch: pytest.MonkeyPatch, server_impl: str) -> None:
    if not nativeserver.available():
        pytest.skip(nativeserver.status())
    nativeserver.use(None)
    monkeypatch.delenv("SDCP_SERVER", raising=False)
    assert nativeserver.implementation() == nativeserver.NATIVE


def test_without_the_build_the_default_is_the_python_server_unless_required(monkeypatch: pytest.MonkeyPatch,
                                                                             server_impl: str) -> None:
    nativeserver.use(None)
    monkeypatch.delenv("SDCP_SERVER", raising=False)
    monkeypatch.delenv("SDCP_REQUIRE_NATIVE_H2", raising=False)
    monkeypatch.setattr(nativeserver, "_load", lambda: (None, "native I/O (sdcp_fast._nio) is missing (test)"))
    assert nativeserver.implementation() == nativeserver.PY
    assert "missing" in nativeserver.status()
    monkeypatch.setenv("SDCP_SERVER", "native")
    with pytest.raises(ImportError, match="missing"):
        nativeserver.implementation()
    monkeypatch.delenv("SDCP_SERVER")
    monkeypatch.setenv("SDCP_REQUIRE_NATIVE_H2", "1")  # CI: a missing build is a failure, not a fallback
    with pytest.raises(ImportError, match="missing"):
        nativeserver.implementation()
    monkeypatch.setenv("SDCP_SERVER", "py")
    assert nativeserver.implementation() == nativeserver.PY


def test_concurrent_requests_reach_python_in_batches_with_their_peer(certs: Certs, server_impl: str) -> None:
    if server_impl != nativeserver.NATIVE:
        pytest.skip("batches are the native server's")
    n = 32
    peers: list[object] = []

    async def handler(request: Request) -> Response:
        peers.append(request.peer)
        return Response(200, request.body)

    async def scenario() -> tuple[list[bytes], int]:
        ctx = server_context(*certs.pair("server"), certs.ca)
        async with await serve(handler, "127.0.0.1", 0, ssl=ctx) as server, \
                H2Transport(client_context(*certs.pair("client"), certs.ca)) as client:
            assert isinstance(server, nativeserver.NativeServer)
            base = f"https://127.0.0.1:{server.port}/"
            await client.request(base, "GET", "warm")  # the connection exists before the burst
            core = server._core
            takes = 0

            class Counting:  # the native core, counting its take() calls (one per wake-up)
                def __getattr__(self, name: str) -> object:
                    return getattr(core, name)

                def take(self) -> object:
                    nonlocal takes
                    takes += 1
                    return core.take()

            server._core = Counting()
            bodies = await asyncio.gather(*(client.request(base, "POST", "echo", body=str(i).encode())
                                            for i in range(n)))
            server._core = core
            return [b.body for b in bodies], takes

    bodies, takes = run(scenario())
    assert bodies == [str(i).encode() for i in range(n)]
    # The client writes the burst's frames at once; the thread hands on all it decoded per wake-up.
    assert 1 <= takes < n
    assert {getattr(p, "uri", None) for p in peers} == {CLIENT_URI}


def test_a_body_of_any_bytes_like_type_is_sent(certs: Certs, server_impl: str) -> None:
    # The MLC answers reads with a memoryview of its tier: the native thread once refused it
    # and, with it, every response of its batch, which then waited for the client's timeout.
    bodies = {"bytes": b"abc", "bytearray": bytearray(b"defg"), "memoryview": memoryview(b"xhijkx")[1:-1],
              "empty-view": memoryview(b"")}

    async def handler(request: Request) -> Response:
        return Response(200, bodies[request.path])

    async def scenario() -> list[bytes]:
        ctx = server_context(*certs.pair("server"), certs.ca)
        async with await serve(handler, "127.0.0.1", 0, ssl=ctx) as server, \
                H2Transport(client_context(*certs.pair("client"), certs.ca)) as client:
            base = f"https://127.0.0.1:{server.port}/"
            answers = await asyncio.gather(*(client.request(base, "GET", name, timeout=20) for name in bodies))
            return [a.body for a in answers]

    assert run(scenario()) == [bytes(b) for b in bodies.values()]


@pytest.mark.parametrize("refused_by", ["python", "thread"])
def test_a_response_that_cannot_be_sent_resets_its_stream_alone(certs: Certs, server_impl: str,
                                                               refused_by: str) -> None:
    if server_impl != nativeserver.NATIVE and refused_by == "thread":
        pytest.skip("batches of responses are the native server's")
    arrived: list[str] = []
    both = asyncio.Event()

    async def handler(request: Request) -> Response:
        # Both answers leave in one loop iteration, so in one batch to the native thread.
        arrived.append(request.path)
        if len(arrived) == 2:
            both.set()
        await both.wait()
        if request.path == "good":
            return Response(200, b"good")
        return Response(200, 12345 if refused_by == "python" else b"bad")  # type: ignore[arg-type]

    async def scenario() -> tuple[bytes, BaseException | None]:
        ctx = server_context(*certs.pair("server"), certs.ca)
        async with await serve(handler, "127.0.0.1", 0, ssl=ctx) as server, \
                H2Transport(client_context(*certs.pair("client"), certs.ca)) as client:
            core = getattr(server, "_core", None)

            class Unreadable:  # the native core, handed a body it cannot read for the "bad" stream
                def __getattr__(self, name: str) -> object:
                    return getattr(core, name)

                def submit(self, batch: list[tuple[object, ...]]) -> object:
                    return core.submit([(*c[:4], 12345, c[5]) if c[4] == b"bad" else c for c in batch])

            if refused_by == "thread":
                assert isinstance(server, nativeserver.NativeServer)
                server._core = Unreadable()
            base = f"https://127.0.0.1:{server.port}/"
            good, bad = await asyncio.gather(client.request(base, "GET", "good", timeout=20),
                                             client.request(base, "GET", "bad", timeout=20),
                                             return_exceptions=True)
            if isinstance(server, nativeserver.NativeServer):
                server._core = core
            assert isinstance(good, Response), good
            return good.body, bad if isinstance(bad, BaseException) else None

    good, bad = run(scenario())
    assert good == b"good"
    assert isinstance(bad, TransportError) and not isinstance(bad, TransportTimeout), bad


class _Direct:
    """A handler with direct routes ("now/<x>", "later/<x>", "cancelled", "failed") counting
    the requests that took the general path."""

    def __init__(self) -> None:
        self.general: list[str] = []
        self.pending: list[asyncio.Future[Any]] = []

    async def __call__(self, request: Request) -> Response:
        self.general.append(request.path)
        answer = self.answer_now(request.method, request.path, request.query, request.body, request.headers,
                                 request.peer)
        if answer is None:
            return Response(200, b"general " + request.path.encode())
        if isinstance(answer, Response):
            return answer
        await asyncio.wait([answer])
        return self.settled(answer)

    def answer_now(self, method: str, path: str, query: Mapping[str, str], body: bytes, headers: Mapping[str, str],
                   peer: Peer | None) -> Response | asyncio.Future[Any] | None:
        kind, _, rest = path.partition("/")
        text = f"{rest} {query.get('from', '-')} {getattr(peer, 'uri', None)} ".encode() + body
        if kind == "now":
            return Response(200, text, MappingProxyType({"content-type": "text/plain"}))
        if kind not in ("later", "cancelled", "failed"):
            return None
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.pending.append(future)
        loop = asyncio.get_running_loop()
        if kind == "later":
            loop.call_later(0.05, future.set_result, Response(201, text))
        elif kind == "cancelled":
            loop.call_later(0.05, future.cancel)
        else:
            loop.call_later(0.05, future.set_exception, ValueError("a bug"))
        return future

    def settled(self, future: asyncio.Future[Any]) -> Response:
        error = future.exception()
        return Response(500, b"failed") if error is not None else future.result()  # type: ignore[no-any-return]


def test_a_direct_handler_answers_alike_on_both_servers_and_without_a_task_on_the_native_one(
        certs: Certs, server_impl: str) -> None:
    handler = _Direct()
    assert isinstance(handler, DirectHandler)

    async def scenario() -> tuple[list[object], int]:
        ctx = server_context(*certs.pair("server"), certs.ca)
        async with await serve(handler, "127.0.0.1", 0, ssl=ctx) as server, \
                H2Transport(client_context(*certs.pair("client"), certs.ca)) as client:
            base = f"https://127.0.0.1:{server.port}/"
            spawned = 0
            if isinstance(server, nativeserver.NativeServer):
                spawn = server._spawn

                def counting(coro: Coroutine[Any, Any, None]) -> None:
                    nonlocal spawned
                    spawned += 1
                    spawn(coro)

                server._spawn = counting  # type: ignore[method-assign]
            calls = [client.request(base, "POST", "now/a", body=b"x", query={"from": "3"}, timeout=20),
                     client.request(base, "GET", "later/b", timeout=20),
                     client.request(base, "GET", "failed", timeout=20),
                     client.request(base, "GET", "other", timeout=20),
                     client.request(base, "GET", "now/a b", timeout=20)]
            answers = await asyncio.gather(*calls)
            with pytest.raises(TransportError):
                await client.request(base, "GET", "cancelled", timeout=20)
            return [(a.status, a.body, a.headers.get("content-type")) for a in answers], spawned

    answers, spawned = run(scenario())
    assert answers == [(200, b"a 3 " + CLIENT_URI.encode() + b" x", "text/plain"),
                       (201, b"b - " + CLIENT_URI.encode() + b" ", None), (500, b"failed", None),
                       (200, b"general other", None),
                       (200, b"a b - " + CLIENT_URI.encode() + b" ", "text/plain")]
    if server_impl == nativeserver.NATIVE:
        # Only what the handler does not answer directly, or whose path is escaped, takes a task.
        assert handler.general == ["other", "now/a b"] and spawned == 2
    else:
        assert set(handler.general) == {"now/a", "later/b", "failed", "other", "now/a b", "cancelled"}


async def _ok(request: Request) -> Response:
    return Response(200, b"ok")
