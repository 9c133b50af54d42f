"""``sdcp-fast cluster up|down`` on simulated hosts: three namespaces whose etcd members form
one cluster over the bridge, an MLC node per host registered in it (started again when it
exits), a host cut off (its link
down) leaving the registry once its lease expires and coming back once the link is up, a
host killed and started again (``simulate.restart``) rejoining etcd from its data, and
nothing left after ``down``."""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.request
from pathlib import Path

import pytest

from sdcp_fast.cluster import simulate
from sdcp_fast.cluster.membership_etcd import Membership
from sdcp_fast.cluster.netns import link_names, namespaces
from sdcp_fast.cluster.spec import ClusterSpec, only

from .conftest import layout

pytestmark = pytest.mark.services


def etcd_members(url: str) -> list[str]:
    request = urllib.request.Request(url + "/v3/cluster/member/list", data=b"{}", method="POST")
    with urllib.request.urlopen(request, timeout=5) as r:
        return sorted(m["name"] for m in json.loads(r.read())["members"])


def wait_registered(spec: ClusterSpec, names: set[str], deadline_s: float = 60.0) -> None:
    """Until exactly ``names`` are registered (the leases' expiry and renewal are the events)."""
    m = Membership(spec.token, spec.etcd_clients(), timeout=2)
    try:
        deadline = time.monotonic() + deadline_s
        while (now := {x.name for x in m.members()}) != names:
            assert time.monotonic() < deadline, f"registered: {sorted(now)}, expected {sorted(names)}"
            time.sleep(0.5)
    finally:
        m.close()


def node_pids(directory: Path, host: str) -> dict[str, int]:
    return {p["name"]: p["pid"] for p in json.loads((directory / host / "node.json").read_text())["processes"]}


def test_etcd_members_form_one_cluster_a_cut_off_host_leaves_and_rejoins_and_down_leaves_nothing(
        cluster_dir: Path) -> None:
    spec = only(layout(3), ("etcd", "mlc"))
    endpoints = simulate.up(cluster_dir, spec, timeout=120)
    state = json.loads((cluster_dir / "cluster.json").read_text())
    net = simulate.network(cluster_dir)
    assert [(h["name"], h["address"]) for h in state["hosts"]] == [(h.name, h.address) for h in spec.hosts]
    for host in state["hosts"]:
        assert host["netns"] in namespaces()
        assert [(p["role"], p["name"]) for p in host["processes"]] == [
            ("etcd", f"etcd-{host['name']}"), ("mlc", f"mlc-{host['name']}")]
        assert host["processes"][0]["uri"] == f"http://{host['address']}:2379"
        assert {p["pid"] for p in host["processes"]} <= set(net.pids(host["name"]))
    for url in endpoints["etcd"]:  # each member, from the machine's own namespace, sees all three
        assert etcd_members(url) == ["etcd-h1", "etcd-h2", "etcd-h3"]
    wait_registered(spec, {"mlc-h1", "mlc-h2", "mlc-h3"}, 5)

    mlc_h1 = state["hosts"][0]["processes"][1]["pid"]  # an instance that exits is started again
    os.kill(mlc_h1, signal.SIGKILL)
    deadline = time.monotonic() + 60
    while (pid := node_pids(cluster_dir, "h1")["mlc-h1"]) == mlc_h1:
        assert time.monotonic() < deadline, "mlc-h1 was not started again"
        time.sleep(0.5)
    assert pid in net.pids("h1")
    wait_registered(spec, {"mlc-h1", "mlc-h2", "mlc-h3"})

    net.cut_off("h2")
    wait_registered(spec, {"mlc-h1", "mlc-h3"})
    net.restore("h2")
    wait_registered(spec, {"mlc-h1", "mlc-h2", "mlc-h3"})

    assert simulate.down(cluster_dir) == []
    assert not {net.netns(h.name) for h in spec.hosts} & set(namespaces())
    assert not ({net.bridge} | {net.veth(h.name) for h in spec.hosts}) & set(link_names())
    assert not (cluster_dir / "cluster.json").exists() and not (cluster_dir / "endpoints.json").exists()


def test_a_host_that_cannot_start_takes_the_whole_cluster_down_and_says_why(cluster_dir: Path) -> None:
    spec = only(layout(2), ("verifier",))  # verifiers with no MLC to share: each node refuses to start
    try:
        simulate.up(cluster_dir, spec, timeout=60)
    except RuntimeError as exc:
        assert "exited with 1" in str(exc) and "no host runs an MLC" in str(exc)
    else:
        raise AssertionError("up succeeded")
    assert not (cluster_dir / "cluster.json").exists()
    tag = json.loads((cluster_dir / "cluster.down.json").read_text())["tag"]
    assert not [name for name in [*namespaces(), *link_names()] if tag in name]


def test_a_killed_host_restarts_its_etcd_member_from_its_data(cluster_dir: Path) -> None:
    spec = only(layout(3), ("etcd",))
    simulate.up(cluster_dir, spec, timeout=120)
    net = simulate.network(cluster_dir)
    old = node_pids(cluster_dir, "h2")
    net.kill("h2")
    deadline = time.monotonic() + 30
    while net.pids("h2"):
        assert time.monotonic() < deadline, f"h2 still runs {net.pids('h2')}"
        time.sleep(0.1)
    simulate.restart(cluster_dir, "h2", timeout=120)
    assert node_pids(cluster_dir, "h2")["etcd-h2"] != old["etcd-h2"]
    state = json.loads((cluster_dir / "cluster.json").read_text())
    assert {p["name"]: p["pid"] for h in state["hosts"] if h["name"] == "h2" for p in h["processes"]} == node_pids(
        cluster_dir, "h2")  # cluster.json names the new processes
    h2 = spec.host("h2").address
    assert etcd_members(f"http://{h2}:{spec.ports['etcd']}") == ["etcd-h1", "etcd-h2", "etcd-h3"]
