"""The delay between simulated hosts (``--rtt-ms``): a TCP echo across two namespaces takes
the round trip asked for and little more, also after a host was cut off and came back, the
machine's own namespace reaches the hosts undelayed, 0 adds nothing, and a cluster whose
etcd members talk across the delay comes up, says how its delay is made and leaves nothing
behind."""

from __future__ import annotations

import json
import secrets
import statistics
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from sdcp_fast.cluster import relay, simulate
from sdcp_fast.cluster.netns import Network, free_subnet, namespaces
from sdcp_fast.cluster.spec import ClusterSpec, HostSpec, host_addresses

from .conftest import require_etcd, require_namespaces

ECHO_SERVER = ("import socket\ns = socket.create_server(('0.0.0.0', 7000))\nprint('ok', flush=True)\n"
               "while True:\n    c, _ = s.accept()\n    while (b := c.recv(100)):\n        c.sendall(b)\n")
ECHO_CLIENT = """import socket, sys, time
c = socket.create_connection((sys.argv[1], 7000), timeout=10)
c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
for _ in range(int(sys.argv[2])):
    t = time.monotonic()
    c.sendall(b"x")
    c.recv(10)
    print((time.monotonic() - t) * 1000)
"""


@pytest.fixture
def network() -> Iterator[Network]:
    require_namespaces()
    bridge, addresses = host_addresses(2, free_subnet())
    net = Network(secrets.token_hex(3), f"{bridge}/24", (("h1", addresses[0]), ("h2", addresses[1])))
    server = None
    try:
        net.up()
        server = subprocess.Popen(net.exec_argv("h2", [sys.executable, "-c", ECHO_SERVER]), stdout=subprocess.PIPE)
        assert server.stdout is not None and server.stdout.readline() == b"ok\n"
        yield net
    finally:
        if server is not None:
            server.kill()
            server.wait()
        net.down()


def round_trips_ms(net: Network, host: str | None, rounds: int = 20) -> list[float]:
    """Round trips of one byte from ``host`` (None: the machine's own namespace) to h2's echo."""
    argv = [sys.executable, "-c", ECHO_CLIENT, net.hosts[1][1], str(rounds)]
    done = subprocess.run(argv if host is None else net.exec_argv(host, argv), capture_output=True, text=True,
                          timeout=120, check=True)
    return sorted(float(line) for line in done.stdout.split())


@pytest.mark.parametrize("method", ["relay", "netem"])
def test_rtt_20_between_hosts_and_none_to_the_machine(network: Network, method: str) -> None:
    if method == "netem" and not relay.netem_works(network):
        pytest.skip("this kernel has no sch_netem (or prio, u32): the relay stands in for it")
    delay = relay.install(network, 20.0, method=method)
    try:
        across = round_trips_ms(network, "h1")
        assert across[0] >= 20.0, across
        assert statistics.median(across) < 20.0 + 30.0, across  # the slack of a loaded 2-core machine
        assert statistics.median(round_trips_ms(network, None)) < 10.0  # the machine is no host
        network.cut_off("h2")
        network.restore("h2")
        assert round_trips_ms(network, "h1", 5)[0] >= 20.0  # a host cut off and back is still delayed
    finally:
        relay.remove(network, delay)
    assert relay.leftovers(network, delay) == []
    assert statistics.median(round_trips_ms(network, "h1")) < 10.0


def test_zero_adds_nothing(network: Network) -> None:
    delay = relay.install(network, 0.0)
    assert delay == relay.Delay(0.0, "none")
    assert f"lookup {relay.table_of(network)}" not in subprocess.run(["ip", "rule", "show"], capture_output=True,
                                                                     text=True).stdout
    assert relay.tun_name(network) not in subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert statistics.median(round_trips_ms(network, "h1")) < 10.0
    with pytest.raises(ValueError, match="0 or more"):
        relay.install(network, -1.0)


def test_a_cluster_up_with_rtt_runs_its_etcd_across_the_relay_and_down_removes_it(tmp_path: Path) -> None:
    require_namespaces()
    require_etcd()
    _, addresses = host_addresses(2, free_subnet())
    spec = ClusterSpec(tuple(HostSpec(f"h{i + 1}", a, ("etcd",)) for i, a in enumerate(addresses)))
    try:
        simulate.up(tmp_path, spec, timeout=120, rtt_ms=4.0)
        delay = relay.Delay.from_json(json.loads((tmp_path / "cluster.json").read_text())["delay"])
        assert delay.rtt_ms == 4.0 and delay.method in ("netem", "relay")
        from sdcp_fast.cli import main

        assert main(["cluster", "status", "--dir", str(tmp_path)]) == 0  # the two members made a quorum
    finally:
        assert simulate.down(tmp_path) == []
    tag = json.loads((tmp_path / "cluster.down.json").read_text())["tag"]
    assert not any(n.startswith(f"sdcp-{tag}-") for n in namespaces())
    assert delay.relay_pid is None or not relay._is_relay(delay.relay_pid, delay.tun or "")
