"""TLS contexts (1.3 only, client certificates required, ALPN h2) and the peer they prove."""

from __future__ import annotations

import ssl

from sdcp_fast.protocol.peer import Peer, PeerRole
from sdcp_fast.transport.tls import client_context, peer_of, server_context
from tests.transport.transport_util import Certs


def test_contexts_require_tls13_and_client_certificates(certs: Certs) -> None:
    server = server_context(*certs.pair("server"), certs.ca)
    client = client_context(*certs.pair("client"), certs.ca)
    for ctx in (server, client):
        assert ctx.minimum_version == ssl.TLSVersion.TLSv1_3
        assert ctx.verify_mode == ssl.CERT_REQUIRED
    assert client.check_hostname


class _FakeTls:
    def __init__(self, cert: dict[str, object]) -> None:
        self.cert = cert

    def getpeercert(self) -> dict[str, object]:
        return self.cert


def test_peer_of_reads_uri_sans() -> None:
    cert = {"subjectAltName": (("URI", "https://127.0.0.1:8511/"), ("URI", "urn:sdcp:role:drafter"),
                               ("DNS", "localhost"), ("IP Address", "127.0.0.1"))}
    assert peer_of(_FakeTls(cert)) == Peer("https://127.0.0.1:8511/", PeerRole.DRAFTER)  # type: ignore[arg-type]


def test_no_verified_certificate_is_no_peer() -> None:
    assert peer_of(None) is None
    assert peer_of(_FakeTls({})) is None  # type: ignore[arg-type]
