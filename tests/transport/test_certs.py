"""Development certificates: SANs that carry the SDCP identity, private keys, the CLI."""

from __future__ import annotations

import ipaddress
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


def test_instance_files_feed_the_tls_contexts(tmp_path: Path) -> None:
    from sdcp_fast.transport.certs import instance_files
    from sdcp_fast.transport.tls import client_context, server_context

    write_certificates(tmp_path, [InstanceSpec("v", PeerRole.VERIFIER, "https://127.0.0.1:1/")])
    server_context(*instance_files(tmp_path, "v"))
    client_context(*instance_files(tmp_path, "v"))
