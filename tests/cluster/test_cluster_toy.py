"""The default layout of three simulated hosts with the toy model: every instance registered
in etcd, completions through each host's front end from the machine's own namespace, and a
host killed with -9: its instances leave the registry once their leases expire, and the
other hosts' front ends go on serving."""

from __future__ import annotations

import json
import time
import urllib.request
from dataclasses import asdict
from pathlib import Path

import pytest

from sdcp_fast.cli import main
from sdcp_fast.cluster import simulate
from sdcp_fast.cluster.membership import cert_digest
from sdcp_fast.cluster.membership_etcd import Membership
from sdcp_fast.cluster.spec import NOT_SDCP, ClusterSpec
from tests.deploy.test_up import greedy_text

pytestmark = pytest.mark.services

PROMPT = "the verifier commits"


def complete(url: str, key: str, prompt: str, n: int) -> dict:
    request = urllib.request.Request(url + "completions", data=json.dumps(
        {"model": "toy", "prompt": prompt, "max_tokens": n}).encode(), headers={
        "Authorization": f"Bearer {key}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as r:
        return json.loads(r.read())


def registered(spec: ClusterSpec) -> dict[str, str]:
    m = Membership(spec.token, spec.etcd_clients())
    try:
        return {x.name: x.uri for x in m.members()}
    finally:
        m.close()


def test_every_instance_is_registered_with_its_uri_and_certificate(cluster: tuple[Path, ClusterSpec],
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    directory, spec = cluster
    m = Membership(spec.token, spec.etcd_clients())
    try:
        members = m.members()
    finally:
        m.close()
    state = json.loads((directory / "cluster.json").read_text())
    placed = {p["name"]: p["uri"] for h in state["hosts"] for p in h["processes"] if p["role"] not in NOT_SDCP}
    assert {x.name: x.uri for x in members} == placed
    assert len(placed) == 9  # an MLC node per host, two routers, two verifiers, two drafters
    for x in members:
        assert x.cert_sha256 == cert_digest((directory / "certs" / f"{x.name}.pem").read_bytes())
        assert x.host == x.name.rpartition("-")[2]
    assert main(["cluster", "status", "--dir", str(directory)]) == 0
    assert json.loads(capsys.readouterr().out) == [asdict(x) for x in members]


def test_a_completion_through_each_front_end_from_the_machine(cluster: tuple[Path, ClusterSpec]) -> None:
    directory, _ = cluster
    endpoints = json.loads((directory / "endpoints.json").read_text())
    assert len(endpoints["frontends"]) == 2
    expected = greedy_text(PROMPT, 12)
    for url in endpoints["frontends"]:
        out = complete(url, endpoints["api_key"], PROMPT, 12)
        assert out["choices"][0]["text"] == expected, url


def test_a_killed_host_leaves_the_registry_when_its_leases_expire_and_the_others_serve_on(cluster: tuple[Path, ClusterSpec]) -> None:
    directory, spec = cluster
    before = registered(spec)
    assert {"mlc-h3", "verifier-h3", "drafter-h3"} <= set(before)
    simulate.network(directory).kill("h3")  # -9 to every process of h3: its node, etcd member and roles
    deadline = time.monotonic() + 60  # leases of 3 s; the rest is for a loaded machine
    while {"mlc-h3", "verifier-h3", "drafter-h3"} & set(now := registered(spec)):
        assert time.monotonic() < deadline, f"h3's instances still registered: {sorted(now)}"
        time.sleep(0.5)
    assert now == {name: uri for name, uri in before.items() if not name.endswith("-h3")}
    endpoints = json.loads((directory / "endpoints.json").read_text())
    for url in endpoints["frontends"]:  # h1 and h2: a verifier (h2's) and a drafter (h1's) are left
        assert complete(url, endpoints["api_key"], PROMPT, 12)["choices"][0]["text"] == greedy_text(PROMPT, 12)
