"""One MLC node per host on three simulated hosts (the default layout, toy model): a drafter's
q rows are held at its own host's node while the verifier on another host reads them there,
a verifier's objects are at its own host's node, and the text is still the target's greedy
text. Each node is asked for its stats (per scope) over mutual TLS with the client's
certificate, as any client of the cluster would."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from sdcp_fast.cache.http_client import RemoteMLC
from sdcp_fast.cluster.etcd_records import routed_sessions
from sdcp_fast.cluster.spec import ClusterSpec
from sdcp_fast.transport.certs import instance_files
from sdcp_fast.transport.tls import client_context
from tests.cluster.test_cluster_faults import opened
from tests.cluster.test_cluster_toy import complete
from tests.deploy.test_up import greedy_text

pytestmark = pytest.mark.services

PROMPT = "the verifier commits"


class Nodes:
    """Every host's MLC node, polled until stopped: the most leases each held at once (the
    only leased objects are q rows in flight, drafter_q_rows.LEASE_TTL)."""

    def __init__(self, directory: Path, spec: ClusterSpec) -> None:
        ssl = client_context(*instance_files(directory / "certs", "client"))
        self.clients = {i.host: RemoteMLC(i.uri, ssl=ssl, timeout=10) for i in spec.instances("mlc")}
        self.leases = dict.fromkeys(self.clients, 0)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        while not self.stop.is_set():
            for host, client in self.clients.items():
                self.leases[host] = max(self.leases[host], client.stats()["leases"])

    def stats(self, host: str) -> dict[str, Any]:
        return self.clients[host].stats()

    def __enter__(self) -> Nodes:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(30)
        for client in self.clients.values():
            client.close()


def sampled(directory: Path, url: str, seed: int) -> str:
    """A rule-2 completion (temperature 1): its proposals carry q rows."""
    import urllib.request

    endpoints = json.loads((directory / "endpoints.json").read_text())
    request = urllib.request.Request(url + "completions", data=json.dumps(
        {"model": "toy", "prompt": PROMPT, "max_tokens": 60, "temperature": 1.0, "seed": seed}).encode(),
        headers={"Authorization": f"Bearer {endpoints['api_key']}", "Content-Type": "application/json"})
    with opened(request) as r:
        return str(json.loads(r.read())["choices"][0]["text"])


def test_q_rows_are_held_at_their_drafter_s_node_and_verifier_objects_at_the_verifier_s(
        cluster: tuple[Path, ClusterSpec]) -> None:
    directory, spec = cluster
    endpoints = json.loads((directory / "endpoints.json").read_text())
    drafter_hosts = {i.host for i in spec.instances("drafter")}
    used: dict[str, tuple[str, str]] = {}  # session -> (its drafter's host, its verifier's host)
    with Nodes(directory, spec) as nodes:
        for n, url in enumerate([*endpoints["frontends"], *endpoints["frontends"]]):
            before = {s.session for s in routed_sessions(spec)}
            assert sampled(directory, url, seed=n + 1)
            for s in routed_sessions(spec):
                if s.session not in before and s.drafter:
                    used[s.session.hex()] = (spec.host_at(s.drafter), spec.host_at(s.verifier))
            if {d for d, _ in used.values()} == drafter_hosts:
                break
        time.sleep(0.5)  # a last poll after the last verdict
        scopes = {h: nodes.stats(h)["scopes"] for h in nodes.clients}
    assert used, "no session had a drafter"
    for drafter, _ in used.values():
        # The drafter's rows were leased at its own node: the verifier read them across hosts.
        assert nodes.leases[drafter] > 0, (drafter, nodes.leases)
    # No node of a host without a drafter ever held q rows.
    assert all(nodes.leases[h] == 0 for h in set(nodes.leases) - drafter_hosts), nodes.leases
    # Each node accounts for its own objects per scope: the verifiers' (committed tokens, KV
    # pages) at their own hosts' nodes, none at a node whose host has neither verifier nor drafter.
    for _, verifier in used.values():
        assert scopes[verifier].get(spec.scope), (verifier, scopes)


def test_a_completion_is_the_greedy_text(cluster: tuple[Path, ClusterSpec]) -> None:
    directory, _ = cluster
    endpoints = json.loads((directory / "endpoints.json").read_text())
    for url in endpoints["frontends"]:
        assert complete(url, endpoints["api_key"], PROMPT, 24)["choices"][0]["text"] == greedy_text(PROMPT, 24)
