"""Development certificates: SANs that carry the SDCP identity, private keys, the CLI."""

from __future__ import annotations

import contextlib
import ipaddress
import ssl
import stat
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from sdcp_fast.cli import main
from sdcp_fast.protocol.peer import PeerRole, peer_from_uris
from sdcp_fast.transport.certs import DEFAULT_INSTANCES, InstanceSpec, write_certificates


def _sans(path: Path) -> x509.SubjectAlternativeName:
    cert = x509.load_pem_x509_certificate(path.read_bytes())
    return cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value


def test_parse_instance_specs() -> None:
    assert InstanceSpec.parse("drafter-a=drafter:https://127.0.0.1:8511/") == \
        InstanceSpec("drafter-a", PeerRole.DRAFTER, "https://127.0.0.1:8511/")
    assert InstanceSpec.parse("ops=client") == InstanceSpec("ops", PeerRole.CLIENT, None)
    for bad in ("verifier", "x=wizard:https://h/", "x=verifier:ftp://h/", "../x=verifier", "ca=client"):
        with pytest.raises(ValueError):
            InstanceSpec.parse(bad)


def test_files_sans_usages_and_key_modes(tmp_path: Path) -> None:
    spec = InstanceSpec("v", PeerRole.VERIFIER, "https://verifier.example:8501/")
    write_certificates(tmp_path, [spec])
    assert (tmp_path / "ca.pem").exists()
    for key in ("ca.key", "v.key"):
        assert stat.S_IMODE((tmp_path / key).stat().st_mode) == 0o600
    sans = _sans(tmp_path / "v.pem")
    uris = sans.get_values_for_type(x509.UniformResourceIdentifier)
    assert peer_from_uris(uris) == peer_from_uris(["https://verifier.example:8501/", "urn:sdcp:role:verifier"])
    assert set(sans.get_values_for_type(x509.DNSName)) == {"localhost", "verifier.example"}
    assert sans.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1")]
    cert = x509.load_pem_x509_certificate((tmp_path / "v.pem").read_bytes())
    usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert set(usages) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}


def test_ca_is_reused_so_instances_can_be_added(tmp_path: Path) -> None:
    write_certificates(tmp_path, [InstanceSpec("a", PeerRole.DRAFTER, "https://127.0.0.1:1/")])
    ca = (tmp_path / "ca.pem").read_bytes()
    write_certificates(tmp_path, [InstanceSpec("b", PeerRole.DRAFTER, "https://127.0.0.1:2/")])
    assert (tmp_path / "ca.pem").read_bytes() == ca
    issuer = x509.load_pem_x509_certificate(ca)
    for name in ("a", "b"):
        x509.load_pem_x509_certificate((tmp_path / f"{name}.pem").read_bytes()).verify_directly_issued_by(issuer)


def test_cli_default_set(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["certs", str(tmp_path)]) == 0
    for spec in DEFAULT_INSTANCES:
        assert (tmp_path / f"{spec.name}.pem").exists() and (tmp_path / f"{spec.name}.key").exists()
        uris = _sans(tmp_path / f"{spec.name}.pem").get_values_for_type(x509.UniformResourceIdentifier)
        assert peer_from_uris(uris).role is spec.role
        assert peer_from_uris(uris).uri == spec.uri
    roles = [s.role for s in DEFAULT_INSTANCES]
    assert roles.count(PeerRole.VERIFIER) == 2 and roles.count(PeerRole.DRAFTER) == 2
    assert "verifier-standby" in capsys.readouterr().out


def test_cli_given_instances_and_bad_input(tmp_path: Path) -> None:
    assert main(["certs", str(tmp_path), "--instance", "v=verifier:https://127.0.0.1:9001/"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ca.key", "ca.pem", "v.key", "v.pem"]
    assert main(["certs", str(tmp_path), "--instance", "v=nobody"]) == 2


def _handshake(server: ssl.SSLContext, client: ssl.SSLContext) -> tuple[ssl.SSLObject, ssl.SSLObject]:
    """A TLS handshake in memory (no sockets): the server's and the client's side."""
    pipes = [(ssl.MemoryBIO(), ssl.MemoryBIO()) for _ in range(2)]
    s_side = server.wrap_bio(*pipes[0], server_side=True)
    c_side = client.wrap_bio(*pipes[1], server_hostname="127.0.0.1")
    done = {id(s_side): False, id(c_side): False}
    for _ in range(10):
        for side in (c_side, s_side):
            with contextlib.suppress(ssl.SSLWantReadError):
                side.do_handshake()
                done[id(side)] = True
        pipes[0][0].write(pipes[1][1].read())  # client -> server
        pipes[1][0].write(pipes[0][1].read())  # server -> client
        if all(done.values()):
            return s_side, c_side
    raise AssertionError("the handshake did not finish")


def test_instance_files_feed_the_tls_contexts(tmp_path: Path) -> None:
    """instance_files names an instance's own certificate and key and the CA, in the order the
    contexts take them: a verifier's server and a drafter's client built from them complete a
    TLS 1.3 handshake, and each side proves the other's SDCP identity."""
    from sdcp_fast.protocol.peer import Peer
    from sdcp_fast.transport.certs import instance_files
    from sdcp_fast.transport.tls import client_context, peer_of, server_context

    write_certificates(tmp_path, [InstanceSpec("v", PeerRole.VERIFIER, "https://127.0.0.1:1/"),
                                  InstanceSpec("d", PeerRole.DRAFTER, "https://127.0.0.1:2/")])
    assert instance_files(tmp_path, "v") == (str(tmp_path / "v.pem"), str(tmp_path / "v.key"),
                                             str(tmp_path / "ca.pem"))
    server, client = _handshake(server_context(*instance_files(tmp_path, "v")),
                                client_context(*instance_files(tmp_path, "d")))
    assert client.version() == "TLSv1.3" and client.selected_alpn_protocol() == "h2"
    assert peer_of(server) == Peer("https://127.0.0.1:2/", PeerRole.DRAFTER)
    assert peer_of(client) == Peer("https://127.0.0.1:1/", PeerRole.VERIFIER)
