"""A role's store over a cluster's MLC nodes (sdcp_fast/store/nodes.py): writes at home, a name
that names a node read, leased and deleted there, only nodes the registry lists dialled. Each
node here is an in-process store; tests/store/test_nodes_roles.py runs the roles over MLC
servers on loopback."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from sdcp_fast.cache import ObjectUnavailable, object_uri
from sdcp_fast.cache.uri import at_node, node_authority
from sdcp_fast.store import LocalStore, NodeStore, embedded
from sdcp_fast.store.nodes import UnknownNode, located

A, B, C = "198.18.0.11:8470", "198.18.0.12:8470", "198.18.0.13:8470"
ROWS = object_uri(bytes(16), bytes(16), "q_rows", 1, tag="d")
TOKENS = object_uri(bytes(16), bytes(16), "committed_tokens", 1, tag="v")


class Cluster:
    """In-process nodes by authority; ``registry`` what the membership registry lists, and
    every node a store dialled and every registry read, in order."""

    def __init__(self, root: Path, nodes: tuple[str, ...]) -> None:
        self.nodes: dict[str, LocalStore] = {n: embedded(str(root / n.replace(":", "_"))) for n in nodes}
        self.registry = [f"https://{n}" for n in nodes]
        self.dialled: list[str] = []
        self.reads = 0
        self.now = 0.0

    def store(self, home: str) -> NodeStore:
        def known() -> list[str]:
            self.reads += 1
            return list(self.registry)

        return NodeStore(f"https://{home}/", self.open, known, reread_s=1.0, clock=lambda: self.now)

    def open(self, base: str) -> Any:
        self.dialled.append(node_authority(base))
        return Kept(self.nodes[node_authority(base)])

    def close(self) -> None:
        for store in self.nodes.values():
            store.close()


class Kept:
    """A node's store that a NodeStore's close leaves open (the test looks at it after)."""

    def __init__(self, store: LocalStore) -> None:
        self.store = store

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    async def aclose(self) -> None:
        pass


@pytest.fixture
def cluster(tmp_path: Path) -> Any:
    made = Cluster(tmp_path, (A, B, C))
    yield made
    made.close()


def test_a_write_goes_home_and_is_named_there_for_the_other_hosts(cluster: Cluster) -> None:
    async def scenario() -> tuple[str, bytes]:
        drafter, verifier = cluster.store(B), cluster.store(A)
        named = located(drafter, ROWS)
        await drafter.put(named, b"rows")
        return named, bytes(await verifier.get(named))

    named, data = asyncio.run(scenario())
    assert named == at_node(ROWS, B) and data == b"rows"
    # Kept at B under the plain name: its tag, policy and scope accounting are the node's as on one host.
    assert cluster.nodes[B].mlc.contains(ROWS) and not cluster.nodes[A].mlc.contains(ROWS)
    assert cluster.dialled == [B, A, B]  # each store's home, then B for the verifier's read


def test_a_lease_is_held_and_released_at_the_node_that_holds_the_object(cluster: Cluster) -> None:
    async def scenario() -> tuple[str | None, str | None, int]:
        store = cluster.store(A)
        at_home = await store.put(TOKENS, b"t", lease_ttl=30)
        there = await store.put(at_node(ROWS, B), b"rows", lease_ttl=30)
        leases_at_b = cluster.nodes[B].mlc.stats()["leases"]
        await store.release(there or "", drop=True)
        await store.release(at_home or "")
        return at_home, there, leases_at_b

    at_home, there, leases_at_b = asyncio.run(scenario())
    assert at_home is not None and "@" not in at_home  # home's leases are as the node gives them
    assert there is not None and there.endswith("@" + B) and leases_at_b == 1
    assert not cluster.nodes[B].mlc.contains(ROWS)  # spent: dropped with its lease, at B
    assert cluster.nodes[A].mlc.stats()["leases"] == cluster.nodes[B].mlc.stats()["leases"] == 0


def test_a_node_the_registry_does_not_list_is_never_dialled(cluster: Cluster) -> None:
    stranger = "203.0.113.9:8470"
    cluster.registry.remove(f"https://{C}")

    async def scenario() -> list[BaseException]:
        store = cluster.store(A)
        refused = []
        for uri in (at_node(ROWS, stranger), at_node(ROWS, C), at_node(ROWS, stranger)):
            with pytest.raises(UnknownNode) as caught:
                await store.get(uri)
            refused.append(caught.value)
        with pytest.raises(UnknownNode):
            await store.release(f"lease@{C}")
        cluster.now += 1.0  # C joins; the registry is read again once it may be
        cluster.registry.append(f"https://{C}")
        with pytest.raises(ObjectUnavailable):
            await store.get(at_node(ROWS, C))
        return refused

    refused = asyncio.run(scenario())
    # An ObjectUnavailable of its own type: the verifier answers the proposal sdcp-q-unavailable.
    assert all(isinstance(e, ObjectUnavailable) and e.type_uri.endswith("mlc-unknown-node") for e in refused)
    assert cluster.dialled == [A, C]  # C only once registered
    assert cluster.reads == 2  # unknown names do not make a read each: at most one per reread_s


def test_a_plain_name_is_home_s_and_else_looked_for_at_the_other_nodes(cluster: Cluster) -> None:
    async def scenario() -> tuple[bytes, bytes]:
        writer, reader = cluster.store(C), cluster.store(A)
        await writer.put(TOKENS, b"tokens")  # a name its readers make up themselves: no node in it
        found = bytes(await reader.get(TOKENS))
        await reader.put(TOKENS, b"home")  # A's own copy is read first
        with pytest.raises(ObjectUnavailable):
            await reader.head(object_uri(bytes(16), bytes(16), "committed_tokens", 9))
        return found, bytes(await reader.get(TOKENS))

    assert asyncio.run(scenario()) == (b"tokens", b"home")


def test_a_registry_that_cannot_be_read_leaves_the_nodes_known(cluster: Cluster) -> None:
    async def scenario() -> bytes:
        store = cluster.store(A)
        await cluster.store(B).put(ROWS, b"rows")
        await store.known()  # A, B and C

        def away() -> list[str]:
            raise ConnectionError("etcd away")

        store._known_fn = away
        cluster.now += 5.0
        return bytes(await store.get(ROWS))  # missing at home: the nodes known are asked

    assert asyncio.run(scenario()) == b"rows"


def test_outside_a_cluster_a_name_is_left_as_it_is(tmp_path: Path) -> None:
    with embedded(str(tmp_path)) as store:
        assert located(store, ROWS) == ROWS
