"""``sdcp-fast cluster up|down`` on simulated hosts: three namespaces whose etcd members form
one cluster over the bridge, cluster.json saying what runs where, and nothing left after
``down``."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

from sdcp_fast.cluster import simulate
from sdcp_fast.cluster.netns import link_names, namespaces
from sdcp_fast.cluster.spec import only

from .conftest import layout


def etcd_members(url: str) -> list[str]:
    request = urllib.request.Request(url + "/v3/cluster/member/list", data=b"{}", method="POST")
    with urllib.request.urlopen(request, timeout=5) as r:
        return sorted(m["name"] for m in json.loads(r.read())["members"])


def test_three_etcd_members_form_one_cluster_across_hosts_and_down_leaves_nothing(cluster_dir: Path) -> None:
    spec = only(layout(3), ("etcd",))
    endpoints = simulate.up(cluster_dir, spec, timeout=90)
    state = json.loads((cluster_dir / "cluster.json").read_text())
    assert [(h["name"], h["address"]) for h in state["hosts"]] == [(h.name, h.address) for h in spec.hosts]
    for host in state["hosts"]:
        assert host["netns"] in namespaces()
        [etcd] = host["processes"]
        assert etcd["role"] == "etcd" and etcd["uri"] == f"http://{host['address']}:2379"
        assert etcd["pid"] in simulate.network(cluster_dir).pids(host["name"])
    for url in endpoints["etcd"]:  # each member, from the machine's own namespace, sees all three
        assert etcd_members(url) == ["etcd-h1", "etcd-h2", "etcd-h3"]
    net = simulate.network(cluster_dir)
    assert simulate.down(cluster_dir) == []
    assert not {net.netns(h.name) for h in spec.hosts} & set(namespaces())
    assert not ({net.bridge} | {net.veth(h.name) for h in spec.hosts}) & set(link_names())
    assert not (cluster_dir / "cluster.json").exists() and not (cluster_dir / "endpoints.json").exists()
