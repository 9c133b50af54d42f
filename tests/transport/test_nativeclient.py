"""Which HTTP/2 client ``h2_client`` builds: the native thread where ``_nio`` is built and the
context is one it can speak, the pure-Python one otherwise or when asked for. The behaviour
itself is test_h2client.py's, run on both."""

from __future__ import annotations

import ssl

import pytest

from sdcp_fast.transport import nativeclient, nativeserver
from sdcp_fast.transport.errors import TransportError
from sdcp_fast.transport.h2client import H2Transport
from sdcp_fast.transport.nativeclient import NativeH2Transport, h2_client
from sdcp_fast.transport.tls import client_context
from tests.transport.transport_util import Certs, run


@pytest.fixture(autouse=True)
def _built() -> None:
    if not nativeserver.available():
        pytest.skip(nativeserver.status())


def _close(client: H2Transport) -> None:
    run(client.close())


def test_the_native_client_is_the_default_where_built(certs: Certs, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SDCP_CLIENT", raising=False)
    client = h2_client(client_context(*certs.pair("client"), certs.ca))
    assert type(client) is NativeH2Transport
    _close(client)
    plain = h2_client(insecure=True)  # h2c on loopback: the thread speaks it too
    assert type(plain) is NativeH2Transport
    _close(plain)


def test_sdcp_client_py_pins_the_pure_python_client(certs: Certs, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SDCP_CLIENT", "py")
    assert type(h2_client(client_context(*certs.pair("client"), certs.ca))) is H2Transport
    monkeypatch.setenv("SDCP_CLIENT", "quic")
    with pytest.raises(ValueError, match="SDCP_CLIENT"):
        nativeclient.implementation()


def test_a_context_the_thread_cannot_speak_keeps_pythons_tls(certs: Certs, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SDCP_CLIENT", raising=False)
    other = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # not made by client_context: no files to load
    assert type(h2_client(other)) is H2Transport
    changed = client_context(*certs.pair("client"), certs.ca)
    changed.check_hostname = False  # since changed: the thread would check what was made
    assert type(h2_client(changed)) is H2Transport
    with pytest.raises(ValueError, match="client_context"):
        NativeH2Transport(other)


def test_a_request_the_thread_cannot_take_fails_instead_of_waiting(certs: Certs) -> None:
    async def scenario() -> None:
        async with h2_client(insecure=True) as client:
            assert type(client) is NativeH2Transport
            with pytest.raises(TransportError, match="request not sent"):
                # Not one contiguous buffer: refused where the batch is handed to the thread.
                body = memoryview(bytearray(8))[::2]
                await client.request("http://127.0.0.1:9/", "POST", "x", body=body, timeout=5)  # type: ignore[arg-type]

    run(scenario())
