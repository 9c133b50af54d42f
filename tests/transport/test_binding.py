"""--insecure: plain HTTP/2 (h2c, prior knowledge) on loopback only, and said loudly."""

from __future__ import annotations

import json
import logging

import pytest

from sdcp_fast.transport.binding import is_loopback
from sdcp_fast.transport.errors import TransportError
from sdcp_fast.transport.h2client import H2Transport
from sdcp_fast.transport.h2server import serve
from tests.transport.transport_util import echo, run


@pytest.mark.parametrize("host", ["127.0.0.1", "127.3.2.1", "::1", "[::1]", "localhost"])
def test_loopback_hosts(host: str) -> None:
    assert is_loopback(host)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3", "192.168.0.1", "example.org", ""])
def test_other_hosts_are_not_loopback(host: str) -> None:
    assert not is_loopback(host)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3"])
def test_insecure_server_refuses_non_loopback(host: str) -> None:
    async def scenario() -> None:
        with pytest.raises(ValueError, match="loopback"):
            await serve(echo, host, 0, ssl=None, insecure=True)

    run(scenario())


def test_no_tls_without_insecure() -> None:
    async def scenario() -> None:
        with pytest.raises(ValueError, match="SSL context"):
            await serve(echo, "127.0.0.1", 0, ssl=None)

    run(scenario())


def test_insecure_round_trip_on_loopback_warns_and_has_no_peer(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> dict[str, object]:
        async with await serve(echo, "127.0.0.1", 0, ssl=None, insecure=True) as server, \
                H2Transport(insecure=True) as client:
            response = await client.request(f"http://127.0.0.1:{server.port}/", "GET", "whoami")
            return json.loads(response.body)

    with caplog.at_level(logging.WARNING, logger="sdcp_fast.transport"):
        info = run(scenario())
    assert info["peer"] is None
    assert "INSECURE" in caplog.text


def test_insecure_client_reaches_loopback_only() -> None:
    async def scenario() -> None:
        async with H2Transport(insecure=True) as client:
            with pytest.raises(TransportError, match="loopback"):
                await client.request("http://10.1.2.3:8501/", "GET", "x")

    run(scenario())


def _curl() -> str | None:
    import shutil
    import subprocess

    curl = shutil.which("curl")
    if curl is None:
        return None
    return curl if "HTTP2" in subprocess.run([curl, "--version"], capture_output=True, text=True).stdout else None


@pytest.mark.skipif(_curl() is None, reason="needs curl with HTTP2 support on PATH")
def test_insecure_mode_is_h2c_with_prior_knowledge_for_outside_clients() -> None:
    import asyncio
    import subprocess

    async def scenario() -> list[str]:
        async with await serve(echo, "127.0.0.1", 0, ssl=None, insecure=True) as server:
            curl = await asyncio.create_subprocess_exec(
                str(_curl()), "-sS", "--http2-prior-knowledge", "-w", "\n%{http_version}",
                f"http://127.0.0.1:{server.port}/whoami", stdout=subprocess.PIPE)
            out, _ = await curl.communicate()
            return out.decode().rsplit("\n", 1)

    body, version = run(scenario())
    assert version == "2" and json.loads(body)["peer"] is None
