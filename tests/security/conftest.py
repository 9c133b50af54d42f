"""Certificates of a small deployment (router, verifier, two drafters, a client) from one CA,
and one from a foreign CA; a verifier role served over HTTP/2 + mTLS on loopback."""

from __future__ import annotations

from pathlib import Path

import pytest

from sdcp_fast.protocol.peer import PeerRole
from sdcp_fast.transport.certs import InstanceSpec, instance_files, write_certificates

ROUTER = "https://127.0.0.1:8500/"
VERIFIER = "https://127.0.0.1:8501/"
DRAFTER_A = "https://127.0.0.1:8511/"
DRAFTER_B = "https://127.0.0.1:8512/"


class Certs:
    def __init__(self, root: Path) -> None:
        self.root = root

    def files(self, name: str) -> tuple[str, str, str]:
        return instance_files(self.root, name)


@pytest.fixture(scope="session")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    root = tmp_path_factory.mktemp("security-certs")
    write_certificates(root, [InstanceSpec("router", PeerRole.ROUTER, ROUTER),
                              InstanceSpec("verifier", PeerRole.VERIFIER, VERIFIER),
                              InstanceSpec("drafter-a", PeerRole.DRAFTER, DRAFTER_A),
                              InstanceSpec("drafter-b", PeerRole.DRAFTER, DRAFTER_B),
                              InstanceSpec("client", PeerRole.CLIENT, None)])
    return Certs(root)


@pytest.fixture(scope="session")
def foreign(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    """A router certificate with the same SANs under a CA nobody trusts."""
    root = tmp_path_factory.mktemp("security-foreign")
    write_certificates(root, [InstanceSpec("router", PeerRole.ROUTER, ROUTER)])
    return Certs(root)
