"""The MLC over HTTP/2 specifically: refusals before the body, abandoned uploads, and many
concurrent calls of the async client on one connection. Raw HTTP/2 frames are written with
the ``h2`` library over a plain socket to the h2c (insecure, loopback) server."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import time

import h2.config
import h2.connection
import h2.events
import pytest

from sdcp_fast.cache import MLC, object_uri
from sdcp_fast.cache.http_client import AsyncMLC, mlc_transport
from sdcp_fast.cache.tiers.host import HostTier
from sdcp_fast.transport.loop import LoopThread

from .serverkit import rss_growth_over_abandoned_uploads, serving

SCOPE = bytes(range(16))


def name(n: int) -> str:
    return object_uri(SCOPE, b"s" * 16, "q_rows", n).removeprefix("mlc://")


class RawH2:
    """A client connection that sends what we tell it, frame by frame."""

    def __init__(self, base: str) -> None:
        self.sock = socket.create_connection(("127.0.0.1", int(base.rsplit(":", 1)[1])))
        self.sock.settimeout(10)
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        self.conn.initiate_connection()
        self.flush()
        self.events: list[h2.events.Event] = []

    def flush(self) -> None:
        data = self.conn.data_to_send()
        if data:
            self.sock.sendall(data)

    def pump(self) -> None:
        data = self.sock.recv(1 << 20)
        if not data:
            raise ConnectionError("server closed")
        self.events += self.conn.receive_data(data)
        self.flush()

    def put_headers(self, path: str, length: int) -> int:
        stream = self.conn.get_next_available_stream_id()
        self.conn.send_headers(stream, [(":method", "PUT"), (":scheme", "http"), (":authority", "t"),
                                        (":path", path), ("content-length", str(length))])
        self.flush()
        return stream

    def send(self, stream: int, n: int) -> None:
        """``n`` body bytes, as fast as the server's windows allow."""
        chunk = b"\x01" * 16384
        while n:
            window = min(self.conn.local_flow_control_window(stream), self.conn.max_outbound_frame_size, n)
            if window <= 0:
                self.pump()
                continue
            self.conn.send_data(stream, chunk[:window] if window <= len(chunk) else b"\x01" * window)
            n -= window
            self.flush()

    def response(self, stream: int) -> tuple[int, bytes]:
        status, body = 0, b""
        while True:
            for event in self.events:
                if isinstance(event, h2.events.ResponseReceived) and event.stream_id == stream:
                    status = int(dict(event.headers)[b":status"])
                elif isinstance(event, h2.events.DataReceived) and event.stream_id == stream:
                    body += event.data
                elif isinstance(event, (h2.events.StreamEnded, h2.events.StreamReset)) and event.stream_id == stream:
                    return status, body
            self.events.clear()
            self.pump()

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def server(tmp_path):
    with MLC([HostTier(16 << 20)]) as mlc, serving(mlc, http2=True) as base:
        yield base, mlc


def test_a_declared_length_over_the_limit_is_refused_before_the_body(server):
    base, mlc = server
    raw = RawH2(base)
    try:
        stream = raw.put_headers(f"/objects/{name(1)}", 3 << 30)  # no byte of the body sent
        status, body = raw.response(stream)
    finally:
        raw.close()
    assert status == 413 and json.loads(body)["status"] == 413
    assert not mlc.contains("mlc://" + name(1))


def _abandon(base: str, declared: int, sent: int) -> None:
    raw = RawH2(base)
    stream = raw.put_headers(f"/objects/{name(2)}", declared)
    raw.send(stream, sent)
    time.sleep(0.2)  # let the server take it in before the client vanishes
    raw.close()


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads RSS from /proc/self/statm")
def test_abandoned_uploads_free_their_buffers(server):
    base, mlc = server
    grown = rss_growth_over_abandoned_uploads(lambda declared, sent: _abandon(base, declared, sent))
    assert grown < 48 << 20, f"RSS grew {grown >> 20} MiB over four abandoned 48 MiB uploads"
    assert mlc.stats()["index"]["objects"] == 0


def test_the_async_client_runs_many_calls_at_once_on_one_connection(server):
    base, mlc = server
    runner = LoopThread("test-async-mlc")

    async def main() -> list[bytes]:
        client = AsyncMLC(base, mlc_transport(None))
        try:
            uris = [object_uri(SCOPE, b"c" * 16, "q_rows", n) for n in range(64)]
            await asyncio.gather(*(client.put(u, n.to_bytes(4, "big") * 256) for n, u in enumerate(uris)))
            got = await asyncio.gather(*(client.get(u) for u in uris))
            assert client.transport.connections == 1  # type: ignore[attr-defined]
            return [bytes(g) for g in got]
        finally:
            await client.close()

    try:
        got = runner.run(main())
    finally:
        runner.stop()
    assert got == [n.to_bytes(4, "big") * 256 for n in range(64)]
    assert mlc.stats()["index"]["objects"] == 64


def test_the_async_client_encodes_large_tensors_off_its_loop(server, monkeypatch):
    import torch

    import sdcp_fast.cache.http_client as client_module
    import sdcp_fast.mlc_server.server as server_module

    on_loop: list[bool] = []
    dumps = client_module.deterministic_cbor

    def spy(obj):
        if isinstance(obj, dict) and "data" in obj:
            try:
                asyncio.get_running_loop()
                on_loop.append(True)
            except RuntimeError:
                on_loop.append(False)
        return dumps(obj)

    monkeypatch.setattr(client_module, "deterministic_cbor", spy)
    monkeypatch.setattr(server_module.cbor, "deterministic_cbor", spy)  # the server's encoder
    base, _ = server
    runner = LoopThread("test-async-mlc")
    small, large = torch.ones(4, dtype=torch.float32), torch.ones(8, 32000, dtype=torch.float32)

    async def main() -> list[tuple[int, ...]]:
        client = AsyncMLC(base, mlc_transport(None))
        try:
            await client.put(object_uri(SCOPE, b"t" * 16, "q_rows", 1), small)
            await client.put(object_uri(SCOPE, b"t" * 16, "q_rows", 2), large)
            got = await client.get_tensor(object_uri(SCOPE, b"t" * 16, "q_rows", 2))
            return [tuple(got.shape)]
        finally:
            await client.close()

    try:
        assert runner.run(main()) == [(8, 32000)]
    finally:
        runner.stop()
    # The small put, the large put, then the server's encoding of the CBOR GET (off its loop too).
    assert on_loop == [True, False, False], "a 1 MiB tensor was encoded on an event loop"


def test_bodies_still_arriving_are_bounded_across_connections(tmp_path, monkeypatch):
    import sdcp_fast.mlc_server.server as srv

    monkeypatch.setattr(srv, "MAX_INFLIGHT", 4 << 20)  # the server-wide bound of limits()
    monkeypatch.setattr(srv, "MAX_BODY", 4 << 20)  # which is at least one body's limit
    with MLC([HostTier(16 << 20)]) as mlc, serving(mlc, http2=True) as base:
        stalled = []
        for n in range(2):  # two connections each hold 1.5 MiB of a 4 MiB body, then idle
            raw = RawH2(base)
            stream = raw.put_headers(f"/objects/{name(30 + n)}", 4 << 20)
            raw.send(stream, 3 << 19)
            stalled.append(raw)
        time.sleep(0.3)
        third = RawH2(base)
        stream = third.put_headers(f"/objects/{name(32)}", 2 << 20)
        try:
            third.send(stream, 2 << 20)
        except (ConnectionError, OSError):
            pass  # refused mid-body: the answer is already on its way
        status, body = third.response(stream)
        third.close()
        assert status == 503, body[:300]
        assert "on this server" in json.loads(body)["detail"]
        for raw in stalled:
            raw.close()
        time.sleep(0.3)
        fourth = RawH2(base)
        stream = fourth.put_headers(f"/objects/{name(33)}", 2 << 20)
        fourth.send(stream, (2 << 20) - 1)
        fourth.conn.send_data(stream, b"\x01", end_stream=True)
        fourth.flush()
        assert fourth.response(stream)[0] == 201, "the stalled connections gave their bytes back"
        fourth.close()
