"""docs/security.md, "Limits": each bound refuses with a clear problem while the server keeps
serving others. The verifier role over real HTTP/2 + mutual TLS on loopback."""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import h2.config
import h2.connection
import h2.events

from sdcp_fast.model.toy import ToyTarget
from sdcp_fast.protocol import MEDIA_TYPE, SdcpProblem
from sdcp_fast.roles.verifier import VerifierConfig, VerifierRole
from sdcp_fast.roles.wire import SdcpClient
from sdcp_fast.store import embedded
from sdcp_fast.transport.h2client import H2Transport
from sdcp_fast.transport.h2conn import Limits
from sdcp_fast.transport.h2server import serve
from sdcp_fast.transport.inprocess import InProcessNetwork
from sdcp_fast.transport.tls import client_context, server_context
from tests.roles.rolekit import TARGET, assignment, contract, greedy, proposal, session_open, sid

from .conftest import DRAFTER_A, VERIFIER, Certs

V = ToyTarget().vocab_size


@asynccontextmanager
async def verifier(certs: Certs, root: str, limits: Limits | None = None,
                   **kw: Any) -> AsyncIterator[tuple[str, VerifierRole]]:
    mlc = embedded(root)
    config = VerifierConfig(uri=VERIFIER, target_digest=TARGET, backend="reference", batch_wait=0.0, output_wait=0.05,
                            **kw)
    role = VerifierRole(ToyTarget(), config, mlc=mlc, transport=InProcessNetwork().transport(None))
    await role.start()
    server = await serve(role.handler, "127.0.0.1", 0, ssl=server_context(*certs.files("verifier")), limits=limits)
    try:
        async with server:
            yield f"https://127.0.0.1:{server.port}/", role
    finally:
        await role.close()
        mlc.close()


def client(certs: Certs, name: str) -> SdcpClient:
    return SdcpClient(H2Transport(client_context(*certs.files(name)), timeout=20))


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 90))


async def refused(call: Any) -> tuple[str, int]:
    try:
        await call
    except SdcpProblem as problem:
        return problem.suffix, problem.status
    return "served", 200


async def _session(router: SdcpClient, url: str, n: int, **kw: Any) -> Any:
    opened = session_open(sid(n), contract(**kw))
    state = await router.open_session(url, opened)
    return opened, await router.put_drafter(url, assignment(opened, state, drafter=DRAFTER_A))


def test_body_over_the_cap_is_413_and_the_connection_keeps_serving(certs: Certs, tmp_path) -> None:
    async def scenario() -> tuple[int, str, int]:
        async with verifier(certs, str(tmp_path), Limits(max_body=64 * 1024)) as (url, _):
            router = client(certs, "router")
            big = await router.transport.request(url, "POST", "sessions", body=b"\xa0" * (64 * 1024 + 1),
                                                 headers={"content-type": MEDIA_TYPE})
            opened, state = await _session(router, url, 1)
            await router.transport.close()
            return big.status, big.content_type, state.round

    status, kind, round_ = run(scenario())
    assert status == 413 and kind == "application/problem+json" and round_ == 0


def test_tokens_outside_the_vocabulary_m_beyond_limits_and_huge_prompts_are_refused(certs: Certs, tmp_path) -> None:
    """Out-of-vocabulary ids (prompt: 400; proposal: 422 sdcp-bad-proposal), M over m_max
    (422 sdcp-limit), a prompt over max_prompt (400); a good proposal is served afterwards."""
    async def scenario() -> tuple[list[tuple[str, int]], int]:
        async with verifier(certs, str(tmp_path), max_prompt=1000) as (url, _):
            router, drafter = client(certs, "router"), client(certs, "drafter-a")
            opened, state = await _session(router, url, 2, m_max=4)
            answers = [
                await refused(router.open_session(url, session_open(sid(3), contract(), prompt=(1, V)))),
                await refused(router.open_session(url, session_open(sid(4), contract(), prompt=(1,) * 1001))),
                await refused(drafter.propose(url, proposal(state, (V,), drafter=DRAFTER_A))),
                await refused(drafter.propose(url, proposal(state, (2**32 - 1, 1), drafter=DRAFTER_A))),
                await refused(drafter.propose(url, proposal(state, (1,) * 5, drafter=DRAFTER_A))),
                await refused(drafter.propose(url, proposal(state, (1,) * 64, drafter=DRAFTER_A))),
            ]
            verdict = await drafter.propose(url, proposal(state, greedy(ToyTarget(), opened.prompt, 2),
                                                          drafter=DRAFTER_A))
            for c in (router, drafter):
                await c.transport.close()
            return answers, verdict.committed

    answers, committed = run(scenario())
    assert answers == [("sdcp-bad-request", 400), ("sdcp-bad-request", 400), ("sdcp-bad-proposal", 422),
                       ("sdcp-bad-proposal", 422), ("sdcp-limit", 422), ("sdcp-limit", 422)]
    assert committed == 3


def test_deeply_nested_cbor_is_400_without_recursion(certs: Certs, tmp_path) -> None:
    async def scenario() -> list[tuple[int, str]]:
        async with verifier(certs, str(tmp_path)) as (url, _):
            router = client(certs, "router")
            out = []
            for body in (b"\x81" * 100_000 + b"\x00", b"\x9f" * 50_000, b"\xa1\x00" * 50_000 + b"\x00"):
                r = await router.transport.request(url, "POST", "sessions", body=body,
                                                   headers={"content-type": MEDIA_TYPE})
                out.append((r.status, json.loads(r.body)["type"].rsplit(":", 1)[-1]))
            await router.transport.close()
            return out

    assert run(scenario()) == [(400, "sdcp-bad-request")] * 3


def test_too_many_sessions_is_503_busy_and_open_sessions_keep_being_served(certs: Certs, tmp_path) -> None:
    async def scenario() -> tuple[tuple[str, int], int, tuple[str, int]]:
        async with verifier(certs, str(tmp_path), max_sessions=2) as (url, _):
            router, drafter = client(certs, "router"), client(certs, "drafter-a")
            opened, state = await _session(router, url, 10)
            await _session(router, url, 11)
            raw = await router.transport.request(url, "POST", "sessions", body=session_open(sid(12), contract()).encode(),
                                                 headers={"content-type": MEDIA_TYPE})
            busy = (json.loads(raw.body)["type"].rsplit(":", 1)[-1], raw.status)
            again = await refused(router.open_session(url, opened))  # a session it holds: idempotent, served
            verdict = await drafter.propose(url, proposal(state, greedy(ToyTarget(), opened.prompt, 1),
                                                          drafter=DRAFTER_A))
            for c in (router, drafter):
                await c.transport.close()
            return busy, verdict.committed, again

    busy, committed, again = run(scenario())
    assert busy == ("sdcp-busy", 503) and committed == 2 and again == ("served", 200)


async def _raw_h2(url: str, certs: Certs) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, Any]:
    host, port = url.split("//")[1].rstrip("/").split(":")
    ctx = client_context(*certs.files("router"))
    reader, writer = await asyncio.open_connection(host, int(port), ssl=ctx, server_hostname=host)
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
    conn.initiate_connection()
    writer.write(conn.data_to_send())
    return reader, writer, conn


def _headers(url: str, path: str) -> list[tuple[str, str]]:
    return [(":method", "POST"), (":scheme", "https"), (":authority", url.split("//")[1].rstrip("/")),
            (":path", "/" + path), ("content-type", MEDIA_TYPE)]


def test_a_slow_loris_request_is_408_and_others_are_served_meanwhile(certs: Certs, tmp_path) -> None:
    """A request whose body never ends is answered 408 after Limits.request_timeout; while it
    hangs, another client's session is opened."""
    async def scenario() -> tuple[int, int]:
        async with verifier(certs, str(tmp_path), Limits(request_timeout=0.5)) as (url, _):
            reader, writer, conn = await _raw_h2(url, certs)
            conn.send_headers(1, _headers(url, "sessions"))
            conn.send_data(1, b"\xa1")  # and never the rest
            writer.write(conn.data_to_send())
            await writer.drain()
            router = client(certs, "router")
            _, state = await _session(router, url, 20)
            status = 0
            while not status:
                data = await asyncio.wait_for(reader.read(65536), 5)
                assert data, "connection closed without an answer"
                for event in conn.receive_data(data):
                    if isinstance(event, h2.events.ResponseReceived) and event.stream_id == 1:
                        status = int(dict(event.headers)[":status"])
                writer.write(conn.data_to_send())
            writer.close()
            await router.transport.close()
            return status, state.round

    assert run(scenario()) == (408, 0)


def test_streams_beyond_the_connection_limit_are_refused_and_the_server_keeps_serving(certs: Certs,
                                                                                       tmp_path) -> None:
    """SETTINGS_MAX_CONCURRENT_STREAMS: a client opening more streams than advertised has the
    extra ones refused (RST_STREAM REFUSED_STREAM or the connection ended by h2); a
    well-behaved client is still served."""
    async def scenario() -> tuple[bool, int]:
        async with verifier(certs, str(tmp_path), Limits(max_streams=4, request_timeout=5)) as (url, _):
            reader, writer, conn = await _raw_h2(url, certs)
            # Sent before the server's SETTINGS are read, so h2 does not hold us to its limit.
            for stream in range(1, 2 * 12, 2):  # 12 open request streams, bodies never sent
                conn.send_headers(stream, _headers(url, "sessions"))
            writer.write(conn.data_to_send())
            await writer.drain()
            refused_any = False
            try:
                while not refused_any:
                    data = await asyncio.wait_for(reader.read(65536), 5)
                    if not data:
                        refused_any = True
                        break
                    for event in conn.receive_data(data):
                        if isinstance(event, (h2.events.StreamReset, h2.events.ConnectionTerminated)):
                            refused_any = True
                    writer.write(conn.data_to_send())
            except (ConnectionError, ssl.SSLError, h2.exceptions.ProtocolError):
                refused_any = True
            writer.close()
            router = client(certs, "router")
            _, state = await _session(router, url, 30)
            await router.transport.close()
            return refused_any, state.round

    assert run(scenario()) == (True, 0)


def test_bodies_buffered_across_one_connections_streams_are_bounded(certs: Certs, tmp_path) -> None:
    """Limits.max_buffered: streams of one connection cannot each hold up to max_body; the
    stream that overflows the connection's bound is answered 503, the others are not."""
    async def scenario() -> tuple[dict[int, int], int]:
        limits = Limits(max_body=1 << 20, max_buffered=1 << 20, request_timeout=5)
        async with verifier(certs, str(tmp_path), limits) as (url, _):
            reader, writer, conn = await _raw_h2(url, certs)
            while conn.outbound_flow_control_window < (2 << 20):  # the server's windows first
                for _ in conn.receive_data(await asyncio.wait_for(reader.read(65536), 10)):
                    pass
                writer.write(conn.data_to_send())
            for stream in (1, 3, 5):
                conn.send_headers(stream, _headers(url, "sessions"))
                conn.send_data(stream, b"\x00" * (400 << 10))  # never ended
                writer.write(conn.data_to_send())
                await writer.drain()
            statuses: dict[int, int] = {}
            while 5 not in statuses:
                data = await asyncio.wait_for(reader.read(65536), 10)
                assert data
                for event in conn.receive_data(data):
                    if isinstance(event, h2.events.ResponseReceived):
                        statuses[event.stream_id] = int(dict(event.headers)[":status"])
                writer.write(conn.data_to_send())
            writer.close()
            router = client(certs, "router")
            _, state = await _session(router, url, 40)
            await router.transport.close()
            return statuses, state.round

    statuses, round_ = run(scenario())
    assert statuses == {5: 503} and round_ == 0
