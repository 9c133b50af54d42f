"""Simulated hosts on this machine (``sdcp-fast cluster up|down``): a network namespace per
host on a bridge (:mod:`~sdcp_fast.cluster.netns`), and ``sdcp-fast node`` run inside each.

``up`` writes into its folder ``cluster.toml`` (the spec), ``certs/`` (one CA, a
certificate per instance, the front ends' API key), ``cluster.json`` (the network's names,
the delay between hosts and how it is made, then per host its name, namespace, address,
node pid and processes: role, name, pid, base URI) and, once every host is up,
``endpoints.json`` (the front ends, reachable from the machine's own namespace, with their
key). ``cluster.json`` is written before anything
starts, so ``down`` removes what a failed ``up`` left too.
"""

from __future__ import annotations

import ipaddress
import json
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from sdcp_fast.cluster import relay
from sdcp_fast.cluster.host_part import write_cluster_certificates
from sdcp_fast.cluster.netns import Network
from sdcp_fast.cluster.spec import BENCHMARK_RANGE, ClusterSpec, host_addresses, load
from sdcp_fast.deploy.up import Up


def network_of(spec: ClusterSpec, bridge_address: str, prefix_len: int, tag: str) -> Network:
    return Network(tag, f"{bridge_address}/{prefix_len}", tuple((h.name, h.address) for h in spec.hosts))


def up(directory: Path, spec: ClusterSpec, *, prefix_len: int = 24, timeout: float = 240.0,
       rtt_ms: float = 0.0) -> dict[str, Any]:
    """Start ``spec``'s hosts as namespaces (their addresses in one ``/prefix_len`` network
    whose first address is the bridge's), ``rtt_ms`` apart (:mod:`~sdcp_fast.cluster.relay`);
    the contents of ``endpoints.json``. On failure everything made is removed and the error
    names the log to read."""
    directory = directory.resolve()
    directory.mkdir(parents=True, exist_ok=True)
    if (directory / "cluster.json").exists():
        raise FileExistsError(f"{directory / 'cluster.json'} exists: `sdcp-fast cluster down --dir {directory}` first")
    bridge = str(_first_address(spec.hosts[0].address, prefix_len))
    subnet = ipaddress.ip_interface(f"{bridge}/{prefix_len}").network
    if not subnet.subnet_of(BENCHMARK_RANGE) or any(  # type: ignore[arg-type]
            ipaddress.ip_address(h.address) not in subnet or h.address == bridge for h in spec.hosts):
        raise ValueError(f"simulated hosts need addresses in one subnet of {BENCHMARK_RANGE} "
                         f"(here {subnet}, the bridge at {bridge})")
    if rtt_ms < 0:
        raise ValueError(f"--rtt-ms must be 0 or more, not {rtt_ms:g}")
    net = network_of(spec, bridge, prefix_len, secrets.token_hex(3))
    (directory / "cluster.toml").write_text(spec.to_toml())
    write_cluster_certificates(spec, directory / "certs")
    Up(directory).api_key()  # certs/api-key, which the routers read
    state: dict[str, Any] = {"tag": net.tag, "bridge": net.bridge, "bridge_address": net.bridge_cidr,
                             "hosts": [{"name": h.name, "netns": net.netns(h.name), "address": h.address,
                                        "link": net.veth(h.name), "node_pid": None, "processes": []}
                                       for h in spec.hosts]}
    _write_json(directory / "cluster.json", state)
    try:
        net.up()
        state["delay"] = relay.install(net, rtt_ms).to_json()  # cluster.json says netem or relay
        _write_json(directory / "cluster.json", state)
        logs = directory / "logs"
        logs.mkdir(exist_ok=True)
        nodes = {}
        for entry in state["hosts"]:
            nodes[entry["name"]] = _start_node(directory, net, entry["name"], timeout)
            entry["node_pid"] = nodes[entry["name"]].pid
        _write_json(directory / "cluster.json", state)
        deadline = time.monotonic() + timeout
        for entry in state["hosts"]:
            entry.update(_wait_node(directory, entry["name"], nodes[entry["name"]], deadline))
        _write_json(directory / "cluster.json", state)
        _wait_routers(spec, directory, deadline)
    except BaseException:
        down(directory)
        raise
    endpoints = endpoints_of(spec, directory)
    _write_json(directory / "endpoints.json", endpoints)
    return endpoints


def _start_node(directory: Path, net: Network, host: str, timeout: float) -> subprocess.Popen[bytes]:
    argv = net.exec_argv(host, [sys.executable, "-m", "sdcp_fast", "node", "--spec", str(directory / "cluster.toml"),
                                "--host", host, "--dir", str(directory), "--timeout", str(int(timeout))])
    with open(directory / "logs" / f"node-{host}.log", "ab") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"}, start_new_session=True)


def restart(directory: Path, host: str, *, timeout: float = 240.0, wait_routers: bool = True) -> None:
    """Start ``host``'s node again once every process of it is gone (after a kill -9 of the
    host: etcd rejoins from its data), and return when every router hears from every verifier
    and drafter again (without ``wait_routers``: once the node runs, for a host that restarts
    while another is cut off); ``cluster.json`` gets the new processes."""
    directory = directory.resolve()
    net = network(directory)
    if net.pids(host):
        raise RuntimeError(f"{host} still runs processes: {net.pids(host)}")
    (directory / host / "node.json").unlink(missing_ok=True)
    node = _start_node(directory, net, host, timeout)
    deadline = time.monotonic() + timeout
    found = _wait_node(directory, host, node, deadline)
    state = json.loads((directory / "cluster.json").read_text())
    for entry in state["hosts"]:
        if entry["name"] == host:
            entry.update(found, node_pid=node.pid)
    _write_json(directory / "cluster.json", state)
    if wait_routers:
        _wait_routers(load(directory / "cluster.toml"), directory, deadline)


def _first_address(address: str, prefix_len: int) -> Any:
    return ipaddress.ip_interface(f"{address}/{prefix_len}").network.network_address + 1


def _wait_node(directory: Path, host: str, node: subprocess.Popen[bytes], deadline: float) -> dict[str, Any]:
    state_file = directory / host / "node.json"
    while True:
        if state_file.exists():
            data: dict[str, Any] = json.loads(state_file.read_text())
            return {"processes": data["processes"]}
        if node.poll() is not None:
            tail = (directory / "logs" / f"node-{host}.log").read_text(errors="replace")[-1500:]
            raise RuntimeError(f"the node of {host} exited with {node.returncode}:\n{tail}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"the node of {host} did not come up (logs in {directory / 'logs'})")
        time.sleep(0.2)


def _wait_routers(spec: ClusterSpec, directory: Path, deadline: float) -> None:
    """Until every router lists a live status of every verifier and drafter (GET instances): a
    router takes an instance only once it is registered in etcd and has reported its status, and
    until then its front end answers 503, so ``up`` returns when the front ends can serve."""
    import asyncio

    from sdcp_fast.transport.h2client import H2Transport
    from sdcp_fast.transport.tls import client_context

    certs = directory / "certs"
    wanted = {i.uri for role in ("verifier", "drafter") for i in spec.instances(role)}

    async def poll() -> None:
        client = H2Transport(client_context(str(certs / "client.pem"), str(certs / "client.key"), str(certs / "ca.pem")))
        try:
            for router in spec.instances("router"):
                while True:
                    try:
                        response = await client.request(router.uri, "GET", "instances", timeout=5)
                        if response.status == 200 and wanted <= {i["instance"] for i in json.loads(response.body)}:
                            break
                    except (ConnectionError, OSError, TimeoutError):
                        pass
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"{router.uri} did not hear from every verifier and drafter "
                                           f"(logs in {directory / 'logs'})")
                    await asyncio.sleep(0.2)
        finally:
            await client.close()

    asyncio.run(poll())


def endpoints_of(spec: ClusterSpec, directory: Path) -> dict[str, Any]:
    certs = directory / "certs"
    frontends = [f"http://{i.address}:{spec.ports['api']}/v1/" for i in spec.instances("router")]
    return {"model": spec.model, "frontend": frontends[0] if frontends else None, "frontends": frontends,
            "api_key": Up(directory).api_key(), "ca": str(certs / "ca.pem"),
            "client_cert": str(certs / "client.pem"), "client_key": str(certs / "client.key"),
            "etcd": [f"http://{host}:{port}" for host, port in spec.etcd_clients()],
            "logs": str(directory / "logs")}


def network(directory: Path) -> Network:
    """The network ``up`` made in ``directory`` (from its ``cluster.json``)."""
    state = json.loads((directory / "cluster.json").read_text())
    return Network(state["tag"], state["bridge_address"], tuple((h["name"], h["address"]) for h in state["hosts"]))


def down(directory: Path) -> list[str]:
    """Stop every process of the cluster in ``directory`` and remove its namespaces, links
    and bridge; what is left of them (empty when all went)."""
    directory = directory.resolve()
    if not (directory / "cluster.json").exists():
        return []
    net = network(directory)
    state = json.loads((directory / "cluster.json").read_text())
    _stop_nodes([h["node_pid"] for h in state["hosts"] if h.get("node_pid")], net)
    net.down()
    delay = relay.Delay.from_json(state["delay"]) if state.get("delay") else None
    if delay:
        relay.remove(net, delay)
    left = net.leftovers() + (relay.leftovers(net, delay) if delay else [])
    if not left:
        (directory / "cluster.json").rename(directory / "cluster.down.json")
        (directory / "endpoints.json").unlink(missing_ok=True)
    return left


def _stop_nodes(pids: list[int], net: Network, grace: float = 15.0) -> None:
    """TERM the nodes first, so that each revokes its leases while etcd still runs and stops
    its own processes; what is left is the network's to end."""
    import signal

    alive = set(pids) & {pid for host, _ in net.hosts for pid in net.pids(host)}
    for pid in alive:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace
    while alive and time.monotonic() < deadline:
        alive = {pid for pid in alive if _running(pid)}
        time.sleep(0.1)


def _running(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not: reaped here where it is our child)."""
    try:
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False
    except ChildProcessError:
        pass
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    tmp.replace(path)


def default_spec(hosts: int, subnet: str, model: str) -> ClusterSpec:
    from sdcp_fast.cluster.spec import default_layout

    host_addresses(hosts, subnet)  # the subnet's check, with its message
    return default_layout(hosts, subnet=subnet, model=model)
