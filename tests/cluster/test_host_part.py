"""One host's part, without starting it: the certificates of a spec and each process's
command (pure, fast)."""

from __future__ import annotations

import ipaddress
from dataclasses import replace
from pathlib import Path

from cryptography import x509

from sdcp_fast.cluster.host_part import etcd_argv, role_argv, write_cluster_certificates
from sdcp_fast.cluster.spec import NOT_SDCP, default_layout


def sans(path: Path) -> tuple[list[str], list[str], list[object]]:
    cert = x509.load_pem_x509_certificate(path.read_bytes())
    ext = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return (ext.get_values_for_type(x509.UniformResourceIdentifier), ext.get_values_for_type(x509.DNSName),
            ext.get_values_for_type(x509.IPAddress))


def test_one_ca_signs_a_certificate_per_instance_naming_its_uri_role_address_and_host(tmp_path: Path) -> None:
    spec = default_layout(3)
    write_cluster_certificates(spec, tmp_path)
    names = {p.stem for p in tmp_path.glob("*.pem")}
    assert names == {"ca", "client"} | {i.name for i in spec.instances() if i.role not in NOT_SDCP}
    uris, dns, ips = sans(tmp_path / "verifier-h2.pem")
    assert uris == ["https://198.18.0.12:8600/", "urn:sdcp:role:verifier"]
    assert "h2" in dns and ipaddress.ip_address("198.18.0.12") in ips
    uris, dns, ips = sans(tmp_path / "mlc-h3.pem")
    assert uris[0] == "https://198.18.0.13:8470/" and "h3" in dns and ipaddress.ip_address("198.18.0.13") in ips
    ca = x509.load_pem_x509_certificate((tmp_path / "ca.pem").read_bytes())
    for name in names - {"ca"}:
        assert x509.load_pem_x509_certificate((tmp_path / f"{name}.pem").read_bytes()).issuer == ca.subject


def option(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv) if a == flag]


def test_each_role_is_told_its_peers_from_the_spec_and_uses_its_own_host_s_mlc(tmp_path: Path) -> None:
    spec = default_layout(3, model="toy")
    by_name = {i.name: i for i in spec.instances()}
    router = role_argv(spec, by_name["router-h2"], tmp_path, "toy")
    assert option(router, "--uri") == ["https://198.18.0.12:8500/"]
    assert option(router, "--api-listen") == ["198.18.0.12:8000"]
    # No list of peers: the router discovers verifiers and drafters from etcd, its own host's member first.
    assert option(router, "--drafter-model") == []
    assert option(router, "--etcd") == ["127.0.0.1:2379,198.18.0.11:2379,198.18.0.12:2379,198.18.0.13:2379"]
    assert option(router, "--cluster") == [spec.token]
    assert option(router, "--scope") == [spec.scope]
    verifier = role_argv(spec, by_name["verifier-h3"], tmp_path, "toy")
    assert option(verifier, "--router") == ["https://198.18.0.11:8500/,https://198.18.0.12:8500/"]
    assert option(verifier, "--listen") == ["0.0.0.0:8600"]
    drafter = role_argv(spec, by_name["drafter-h3"], tmp_path, "toy")
    assert option(drafter, "--drafter") == ["toy-weak"]
    assert option(router, "--mlc") == ["https://198.18.0.12:8470"]
    for argv in (router, verifier, drafter):
        assert option(argv, "--certs") == [str(tmp_path / "certs")]
        assert option(argv, "--cluster") == [spec.token]  # its store learns the cluster's MLC nodes from etcd
    for argv in (verifier, drafter):
        assert option(argv, "--mlc") == ["https://198.18.0.13:8470"]
        assert option(argv, "--etcd") == ["127.0.0.1:2379,198.18.0.11:2379,198.18.0.12:2379,198.18.0.13:2379"]
    mlc = role_argv(spec, by_name["mlc-h2"], tmp_path, "toy")
    assert option(mlc, "--root") == [str(tmp_path / "h2" / "mlc")] and option(mlc, "--name") == ["mlc-h2"]
    # A host without an MLC node of its own uses the first host's.
    bare = replace(spec, hosts=(spec.hosts[0], replace(spec.hosts[2], roles=("drafter",))))
    lone = role_argv(bare, next(i for i in bare.instances("drafter") if i.host == "h3"), tmp_path, "toy")
    assert option(lone, "--mlc") == ["https://198.18.0.11:8470"]
    etcd = etcd_argv(spec, by_name["etcd-h2"], tmp_path / "etcd")
    assert option(etcd, "--initial-cluster") == [spec.etcd_peers()]
    assert option(etcd, "--listen-peer-urls") == ["http://198.18.0.12:2380"]
    assert option(etcd, "--initial-cluster-token") == [spec.token]
