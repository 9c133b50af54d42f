from __future__ import annotations

import os
from collections.abc import Callable, Iterator

import pytest

from sdcp_fast.protocol.peer import PeerRole
from sdcp_fast.transport import h2native, nativeclient, nativeserver
from sdcp_fast.transport.certs import InstanceSpec, write_certificates
from tests.transport.transport_util import CLIENT_URI, SERVER_URI, Certs


@pytest.fixture(scope="session")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    root = tmp_path_factory.mktemp("certs")
    write_certificates(root, [InstanceSpec("server", PeerRole.VERIFIER, SERVER_URI),
                              InstanceSpec("client", PeerRole.DRAFTER, CLIENT_URI)])
    return Certs(root)


@pytest.fixture(scope="session")
def foreign_certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    """The same names and SANs under another CA, which no test server trusts."""
    root = tmp_path_factory.mktemp("foreign")
    write_certificates(root, [InstanceSpec("client", PeerRole.DRAFTER, CLIENT_URI)])
    return Certs(root)


# The HTTP/2 tests run on both implementations of the framing (sdcp_fast.transport.h2native):
# the pure-Python h2 (py-h2) and nghttp2 (c-h2), as the same tests.
H2_MODULES = frozenset({"test_h2server", "test_h2client", "test_h2conn", "test_h2_refused_stream"})


# The server tests run against both servers h2server.serve can start (as aiohttp runs its
# parser tests against both parsers): the pure-Python one (py) and the native thread (native).
SERVER_MODULES = frozenset({"test_h2server", "test_h2client", "test_h2_refused_stream", "test_streaming",
                            "test_binding", "test_nativeserver"})


# The client tests run against both clients nativeclient.h2_client can build: the pure-Python
# one (py) and the native thread (native).
CLIENT_MODULES = frozenset({"test_h2client"})


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    module = metafunc.module.__name__.rpartition(".")[2]
    if module in H2_MODULES or metafunc.function.__name__.startswith("test_h2_"):
        metafunc.parametrize("h2_impl", [h2native.PY, h2native.C], indirect=True)
    if module in SERVER_MODULES:
        metafunc.parametrize("server_impl", [nativeserver.PY, nativeserver.NATIVE], indirect=True)
    if module in CLIENT_MODULES:
        metafunc.parametrize("client_impl", [nativeclient.PY, nativeclient.NATIVE], indirect=True)


def _pinned(request: pytest.FixtureRequest, use: Callable[[str | None], None]) -> Iterator[str | None]:
    """The test's implementation (its parameter; None: the default) pinned for its run; the
    native one (sdcp_fast._nio) skipped where it is not built, failed where CI requires it."""
    name: str | None = getattr(request, "param", None)
    if name == nativeserver.NATIVE and not nativeserver.available():
        if os.environ.get("SDCP_REQUIRE_NATIVE_H2") == "1":
            pytest.fail(f"SDCP_REQUIRE_NATIVE_H2=1: {nativeserver.status()}")
        pytest.skip(nativeserver.status())
    use(name)
    try:
        yield name
    finally:
        use(None)


@pytest.fixture(autouse=True)
def client_impl(request: pytest.FixtureRequest) -> Iterator[str | None]:
    yield from _pinned(request, nativeclient.use)


@pytest.fixture(autouse=True)
def server_impl(request: pytest.FixtureRequest) -> Iterator[str | None]:
    yield from _pinned(request, nativeserver.use)


@pytest.fixture(autouse=True)
def h2_impl(request: pytest.FixtureRequest) -> Iterator[str | None]:
    name: str | None = getattr(request, "param", None)
    if name == h2native.C and not h2native.available():
        if os.environ.get("SDCP_REQUIRE_NATIVE_H2") == "1":
            pytest.fail(f"SDCP_REQUIRE_NATIVE_H2=1: {h2native.status()}")
        pytest.skip(h2native.status())
    h2native.use(name)
    try:
        yield name
    finally:
        h2native.use(None)
