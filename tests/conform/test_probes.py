"""§5.1 probes on real sockets: our HTTP/2 server passes; the same server accepting TLS 1.2,
or answering HTTP/1.1, is caught (the planted "TLS 1.2 accepted" violation)."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from sdcp_fast.conform.probes import probe
from sdcp_fast.protocol.peer import PeerRole
from sdcp_fast.transport.base import Request, Response
from sdcp_fast.transport.certs import InstanceSpec, instance_files, write_certificates
from sdcp_fast.transport.h2server import serve
from sdcp_fast.transport.tls import server_context

SERVER = "https://127.0.0.1:8501/"


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("probe-certs")
    write_certificates(root, [InstanceSpec("verifier", PeerRole.VERIFIER, SERVER),
                              InstanceSpec("drafter", PeerRole.DRAFTER, "https://127.0.0.1:8511/")])
    return root


async def _health(request: Request) -> Response:
    return Response(204)


async def _http1(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await reader.read(100)
    writer.write(b"HTTP/1.1 204 No Content\r\n\r\n")
    await writer.drain()
    writer.close()


def _run(certs: Path, context: Callable[[ssl.SSLContext], None] | None = None,
         server: Callable[..., Awaitable[object]] | None = None) -> dict[str, tuple[bool, str]]:
    async def scenario() -> dict[str, tuple[bool, str]]:
        ctx = server_context(*instance_files(certs, "verifier"))
        if context is not None:
            context(ctx)
        if server is None:
            srv = await serve(_health, "127.0.0.1", 0, ssl=ctx)
            port = srv.port
        else:
            srv = await asyncio.start_server(server, "127.0.0.1", 0, ssl=ctx)  # type: ignore[arg-type]
            port = srv.sockets[0].getsockname()[1]
        try:
            return await probe(f"https://127.0.0.1:{port}/", *instance_files(certs, "drafter"), timeout=5)
        finally:
            srv.close()
    return asyncio.run(asyncio.wait_for(scenario(), 60))


def _allow_tls12(ctx: ssl.SSLContext) -> None:
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2


def _alpn_http1(ctx: ssl.SSLContext) -> None:
    ctx.set_alpn_protocols(["http/1.1"])


def test_our_server_passes(certs: Path) -> None:
    result = _run(certs)
    assert result["tls13-only"][0] and result["h2-only"][0], result


def test_tls12_accepted_is_caught(certs: Path) -> None:
    assert _run(certs, _allow_tls12)["tls13-only"][0] is False


def test_http1_served_is_caught(certs: Path) -> None:
    assert _run(certs, _alpn_http1, _http1)["h2-only"][0] is False
