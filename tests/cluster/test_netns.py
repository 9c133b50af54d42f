"""Simulated hosts' network: namespaces on a bridge, real TCP between them and from the
machine's own namespace, a host cut off by taking its link down, and nothing left after."""

from __future__ import annotations

import secrets
import subprocess
import sys
from collections.abc import Iterator

import pytest

from sdcp_fast.cluster.netns import NetnsError, Network, free_subnet, link_names, namespaces
from sdcp_fast.cluster.spec import host_addresses

from .conftest import require_namespaces


@pytest.fixture
def network() -> Iterator[Network]:
    require_namespaces()
    bridge, addresses = host_addresses(2, free_subnet())
    net = Network(secrets.token_hex(3), f"{bridge}/24", (("h1", addresses[0]), ("h2", addresses[1])))
    try:
        net.up()
        yield net
    finally:
        net.down()


def connects(net: Network, host: str | None, address: str, port: int) -> bool:
    """Whether a TCP connection from ``host``'s namespace (None: the machine's own) opens."""
    code = f"import socket; socket.create_connection(({address!r}, {port}), timeout=2).close()"
    argv = [sys.executable, "-c", code]
    return subprocess.run(argv if host is None else net.exec_argv(host, argv), capture_output=True,
                          timeout=30).returncode == 0


def test_hosts_talk_tcp_to_each_other_and_to_the_machine_and_a_cut_off_host_to_nobody(network: Network) -> None:
    (_, a1), (_, a2) = network.hosts
    server = subprocess.Popen(network.exec_argv("h2", [
        sys.executable, "-c", "import socket,time; s=socket.create_server(('0.0.0.0', 7000)); print('ok', flush=True);"
        " [s.accept() for _ in range(100)]"]), stdout=subprocess.PIPE)
    try:
        assert server.stdout is not None and server.stdout.readline() == b"ok\n"
        assert connects(network, "h1", a2, 7000)
        assert connects(network, None, a2, 7000)
        assert not connects(network, "h1", "127.0.0.1", 7000)  # h2's loopback is h2's own
        network.cut_off("h2")
        assert not connects(network, "h1", a2, 7000)
        assert not connects(network, None, a2, 7000)
        network.restore("h2")
        assert connects(network, "h1", a2, 7000)
        assert server.pid in network.pids("h2")
    finally:
        server.kill()
        server.wait()


def test_a_second_network_on_the_same_subnet_is_refused(network: Network) -> None:
    other = Network(secrets.token_hex(3), network.bridge_cidr, (("h1", network.hosts[0][1]),))
    try:
        with pytest.raises(NetnsError, match="in use here"):
            other.up()
        assert other.leftovers() == [] and network.leftovers() != []
    finally:
        other.down()


def test_down_removes_namespaces_links_and_bridge(network: Network) -> None:
    assert {network.netns("h1"), network.netns("h2")} <= set(namespaces())
    assert {network.bridge, network.veth("h1"), network.veth("h2")} <= set(link_names())
    sleeper = subprocess.Popen(network.exec_argv("h1", ["sleep", "600"]))
    network.down()
    assert network.leftovers() == []
    assert sleeper.wait(timeout=30) != 0  # stopped with its host


def test_without_namespaces_the_tests_skip_saying_why_and_fail_in_one_line_under_ci(monkeypatch) -> None:
    from tests.cluster import conftest

    monkeypatch.setattr(conftest, "unavailable", lambda: "network namespaces need root")
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="need root"):
        require_namespaces()
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="the cluster tests need network namespaces: .*need root") as err:
        require_namespaces()
    assert not err.value.pytrace and "\n" not in str(err.value)
