from __future__ import annotations

import pytest
from transport_util import CLIENT_URI, SERVER_URI, Certs

from sdcp_fast.protocol.peer import PeerRole
from sdcp_fast.transport.certs import InstanceSpec, write_certificates


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
