"""A development CA and per-instance certificates whose SANs carry the SDCP identity.

Each instance certificate names its base URI and ``urn:sdcp:role:<role>`` as URI SANs (the
scheme in ``sdcp_fast/protocol/peer.py``), the host of its base URI and its further
``hosts`` plus ``localhost`` and ``127.0.0.1`` as DNS/IP SANs, and both the serverAuth and
clientAuth usages: every instance serves requests and makes them. Keys are ECDSA P-256
(cheap handshakes) and are written with mode 0600. This is for development and tests;
production operators bring their own PKI with the same SANs.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from sdcp_fast.protocol.peer import PeerRole, role_uri

CA_DAYS = 3650
LEAF_DAYS = 825


@dataclass(frozen=True)
class InstanceSpec:
    """One certificate to make: file stem, role, and base URI (None for a plain client)."""

    name: str
    role: PeerRole
    uri: str | None = None
    hosts: tuple[str, ...] = ()  # more DNS names or addresses to name (a cluster host's name)

    @classmethod
    def parse(cls, text: str) -> InstanceSpec:
        """``NAME=ROLE:URI`` or ``NAME=ROLE`` (no base URI), e.g.
        ``drafter-a=drafter:https://127.0.0.1:8511/``."""
        name, sep, rest = text.partition("=")
        if not sep or not name or "/" in name or name in ("ca", "."):
            raise ValueError(f"expected NAME=ROLE[:URI], got {text!r}")
        role_text, _, uri = rest.partition(":")
        try:
            role = PeerRole(role_text)
        except ValueError:
            roles = ", ".join(r.value for r in PeerRole)
            raise ValueError(f"unknown role {role_text!r} in {text!r} (one of {roles})") from None
        if uri and urlsplit(uri).scheme not in ("https", "http"):
            raise ValueError(f"base URI must be https://HOST:PORT/..., got {uri!r}")
        return cls(name, role, uri or None)


# The embedded deployment's instances (ports are this project's defaults; the MLC keeps 8470).
DEFAULT_INSTANCES = (
    InstanceSpec("router", PeerRole.ROUTER, "https://127.0.0.1:8500/"),
    InstanceSpec("verifier", PeerRole.VERIFIER, "https://127.0.0.1:8501/"),
    InstanceSpec("verifier-standby", PeerRole.VERIFIER, "https://127.0.0.1:8502/"),
    InstanceSpec("drafter-a", PeerRole.DRAFTER, "https://127.0.0.1:8511/"),
    InstanceSpec("drafter-b", PeerRole.DRAFTER, "https://127.0.0.1:8512/"),
    InstanceSpec("mlc", PeerRole.MLC, "https://127.0.0.1:8470/"),
    InstanceSpec("client", PeerRole.CLIENT, None),
)


@dataclass(frozen=True)
class Issuer:
    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def _write(path: Path, data: bytes, mode: int = 0o644) -> None:
    # Create with the final mode so a key is never readable by others, even briefly.
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def make_ca(common_name: str = "sdcp-fast development CA", days: int = CA_DAYS) -> Issuer:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                     content_commitment=False, key_encipherment=False, data_encipherment=False,
                                     key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return Issuer(cert, key)


def _host_san(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def make_instance(ca: Issuer, spec: InstanceSpec, days: int = LEAF_DAYS) -> Issuer:
    """An instance certificate signed by ``ca`` with the SANs in the module doc."""
    key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = []
    if spec.uri:
        sans.append(x509.UniformResourceIdentifier(spec.uri))
    sans.append(x509.UniformResourceIdentifier(role_uri(spec.role)))
    hosts = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    names = [urlsplit(spec.uri).hostname or ""] if spec.uri and urlsplit(spec.uri).hostname else []
    for host in (_host_san(name) for name in [*names, *spec.hosts]):
        if host not in hosts:
            hosts.append(host)
    sans.extend(hosts)
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, spec.name)]))
        .issuer_name(ca.cert.subject).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=False, crl_sign=False,
                                     content_commitment=False, key_encipherment=False, data_encipherment=False,
                                     key_agreement=True, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                       critical=False)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()), critical=False)
        .sign(ca.key, hashes.SHA256())
    )
    return Issuer(cert, key)


def load_or_make_ca(directory: Path) -> tuple[Issuer, bool]:
    """The CA in ``directory`` (``ca.pem``/``ca.key``) if both exist, else a new one written
    there; the flag says whether it was made now. Reusing it lets instances be added later
    without reissuing the others."""
    cert_path, key_path = directory / "ca.pem", directory / "ca.key"
    if cert_path.exists() and key_path.exists():
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise ValueError(f"{key_path}: expected an EC private key")
        return Issuer(cert, key), False
    ca = make_ca()
    _write(key_path, _key_pem(ca.key), 0o600)
    _write(cert_path, ca.cert.public_bytes(serialization.Encoding.PEM))
    return ca, True


def write_certificates(directory: str | os.PathLike[str],
                       instances: tuple[InstanceSpec, ...] | list[InstanceSpec] = DEFAULT_INSTANCES,
                       days: int = LEAF_DAYS) -> dict[str, tuple[Path, Path]]:
    """Write ``ca.pem`` (and ``ca.key``) and ``<name>.pem``/``<name>.key`` per instance into
    ``directory``; returns ``{name: (cert path, key path)}``."""
    names = [spec.name for spec in instances]
    if len(set(names)) != len(names):
        raise ValueError(f"instance names repeat: {names}")
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    ca, _ = load_or_make_ca(root)
    written = {}
    for spec in instances:
        leaf = make_instance(ca, spec, days)
        cert_path, key_path = root / f"{spec.name}.pem", root / f"{spec.name}.key"
        _write(key_path, _key_pem(leaf.key), 0o600)
        _write(cert_path, leaf.cert.public_bytes(serialization.Encoding.PEM))
        written[spec.name] = (cert_path, key_path)
    return written


def instance_files(directory: str | os.PathLike[str], name: str) -> tuple[str, str, str]:
    """``(certificate, key, CA)`` paths of instance ``name`` in a ``sdcp-fast certs`` folder,
    in the order :func:`~sdcp_fast.transport.tls.server_context` and ``client_context`` take."""
    root = Path(directory)
    return str(root / f"{name}.pem"), str(root / f"{name}.key"), str(root / "ca.pem")
