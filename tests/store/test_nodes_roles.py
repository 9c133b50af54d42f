"""Roles over two MLC nodes (sdcp_fast/store/nodes.py): MLC servers on loopback with mutual TLS
and one CA, the roles on an in-process network. The drafter's home is node B, the verifier's
node A: the drafter's q rows are at B and named there, and the verifier reads them from B; a
name at a node nobody registered is refused without a connection to it."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from sdcp_fast.cache import object_uri
from sdcp_fast.cache.uri import at_node, node_authority, writer_tag
from sdcp_fast.model.toy import ToyDrafter, ToyTarget
from sdcp_fast.protocol import SdcpProblem
from sdcp_fast.protocol.messages import RULE_SPECULATIVE
from sdcp_fast.protocol.peer import Peer, PeerRole
from sdcp_fast.roles.drafter import DrafterRole
from sdcp_fast.roles.verifier import RoundInfo, VerifierConfig, VerifierRole
from sdcp_fast.roles.wire import SdcpClient
from sdcp_fast.store import NodeStore, RemoteStore, embedded
from sdcp_fast.transport.inprocess import InProcessNetwork
from sdcp_fast.transport.tls import client_context, server_context
from tests.mlc_server.serverkit import serving
from tests.roles.rolekit import SCOPE, TARGET, assignment, contract, proposal, run, session_open, until
from tests.store.certkit import make_certs

# The instances the test certificates name (tests/store/certkit.py): the names they write are tagged so.
VERIFIER, DRAFTER, ROUTER = "https://verifier.test:8443/", "https://drafter-a.test:8443/", "https://router.test:8443/"
S = bytes(range(16))


class Rig:
    """Nodes A and B (and C, which serves but nobody registered), a verifier whose store's home
    is A, a drafter whose home is B, and a router client."""

    def __init__(self, certs: dict[str, str], bases: dict[str, str]) -> None:
        self.certs, self.bases = certs, bases
        self.registry = [bases["A"], bases["B"]]
        self.dialled: list[tuple[str, str]] = []  # (who, node) each time a store reaches a node
        self.reads: list[tuple[str, str]] = []  # (node, name) of each of the verifier's reads
        self.rounds: list[RoundInfo] = []
        self.network = InProcessNetwork()
        target = ToyTarget()
        self.verifier = VerifierRole(
            target, VerifierConfig(uri=VERIFIER, target_digest=TARGET, backend="reference", batch_wait=0.0,
                                   output_wait=0.1),
            mlc=self.store("verifier", "A"), transport=self.network.transport(Peer(VERIFIER, PeerRole.VERIFIER)),
            on_round=self.rounds.append)
        self.drafter = DrafterRole(ToyDrafter("good", target, 0.8), uri=DRAFTER, mlc=self.store("client", "B"),
                                   fixed_m=3, transport=self.network.transport(Peer(DRAFTER, PeerRole.DRAFTER)))
        self.network.register(VERIFIER, self.verifier.handler)
        self.network.register(DRAFTER, self.drafter.handler)
        self.router = SdcpClient(self.network.transport(Peer(ROUTER, PeerRole.ROUTER)))  # type: ignore[arg-type]
        self.as_drafter = SdcpClient(self.network.transport(Peer(DRAFTER, PeerRole.DRAFTER)))  # type: ignore[arg-type]

    def store(self, who: str, home: str) -> NodeStore:
        ssl = client_context(self.certs[f"{who}_cert"], self.certs[f"{who}_key"], self.certs["ca"])
        reads = self.reads if who == "verifier" else None

        def open_node(base: str) -> RemoteStore:
            self.dialled.append((who, node_authority(base)))
            return Reading(base, ssl, reads)

        return NodeStore(self.bases[home], open_node, lambda: list(self.registry))

    async def __aenter__(self) -> Rig:
        await self.verifier.start()
        await self.drafter.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.drafter.close()
        await self.verifier.close()
        for role in (self.drafter, self.verifier):
            await role.objects.store.aclose()


class Reading(RemoteStore):
    """A node's store that notes each read (node, name) in ``reads``."""

    def __init__(self, base: str, ssl: Any, reads: list[tuple[str, str]] | None) -> None:
        super().__init__(base, ssl=ssl)
        self.reads = reads

    async def get(self, uri: str) -> memoryview:
        if self.reads is not None:
            self.reads.append((node_authority(self.base_url), uri))
        return await super().get(uri)


@contextlib.asynccontextmanager
async def nodes(tmp_path: Path) -> AsyncIterator[tuple[Rig, dict[str, Any]]]:
    certs = make_certs(tmp_path)
    with contextlib.ExitStack() as stack:
        stores, bases = {}, {}
        for name in "ABC":
            stores[name] = stack.enter_context(embedded(str(tmp_path / name)))
            ctx = server_context(certs["server_cert"], certs["server_key"], certs["ca"], alpn=("h2",))
            bases[name] = stack.enter_context(serving(stores[name].mlc, ctx, logs=stores[name].logs, http2=True))
        async with Rig(certs, bases) as rig:
            yield rig, stores


async def opened(rig: Rig, max_new: int) -> Any:
    """A rule-2 session at the verifier, its drafter assigned (the router's two steps, §6.1)."""
    o = session_open(S, contract(RULE_SPECULATIVE, max_new=max_new))
    state = await rig.router.open_session(VERIFIER, o)
    a = assignment(o, state, drafter=DRAFTER, verifier=VERIFIER)
    confirmed = await rig.router.put_drafter(VERIFIER, a)
    return replace(a, round=confirmed.round, committed=confirmed.committed, digest=confirmed.digest), confirmed


def test_the_verifier_reads_the_drafter_s_rows_at_the_drafter_s_node(tmp_path: Path) -> None:
    async def scenario() -> tuple[str, list[tuple[str, str]], list[tuple[str, str]], int, bool, int]:
        async with nodes(tmp_path) as (rig, stores):
            a, _ = await opened(rig, 12)
            await rig.router.assign(DRAFTER, a)
            await until(lambda: rig.verifier.sessions.get(S).closed, seconds=30)
            # The rows' leases are B's: released there at each verdict, and the spent rows with them.
            await until(lambda: stores["B"].mlc.stats()["leases"] == 0, seconds=10)
            rows = [object_uri(SCOPE, S, "q_rows", r, tag=writer_tag(DRAFTER)) for r in range(1, len(rig.rounds) + 1)]
            held = any(stores[n].mlc.contains(u) for n in "AB" for u in rows)
            return (node_authority(rig.bases["B"]), rig.reads, rig.dialled, len(rig.rounds), held,
                    len(rig.verifier.sessions.get(S).output(0).tokens))

    b, reads, dialled, rounds, held, committed = run(scenario(), timeout=60)
    assert rounds > 0 and committed == 12
    q_reads = [(node, name) for node, name in reads if "/q_rows/" in name]
    assert len(q_reads) == rounds  # every round's rows obtained (none answered sdcp-q-unavailable)
    assert {node for node, _ in q_reads} == {b}  # at the drafter's node, under their plain names
    assert all(name.startswith(f"mlc://{SCOPE.hex()}/") for _, name in q_reads)
    assert ("client", b) in dialled and ("verifier", b) in dialled
    assert not held


def test_rows_named_at_a_node_nobody_registered_are_unavailable_and_never_fetched(tmp_path: Path) -> None:
    async def scenario() -> tuple[BaseException, list[tuple[str, str]], str]:
        async with nodes(tmp_path) as (rig, stores):
            _, state = await opened(rig, 12)
            # C serves the rows, under the drafter's own tag, but is not one of the cluster's nodes.
            plain = object_uri(SCOPE, S, "q_rows", state.round + 1, tag=writer_tag(DRAFTER))
            stores["C"].mlc.put(plain, torch.full((2, rig.verifier.scorer.vocab_size), 0.5).contiguous())
            c = node_authority(rig.bases["C"])
            try:
                await rig.as_drafter.propose(VERIFIER, proposal(state, [4, 5], drafter=DRAFTER,
                                                            q_rows=at_node(plain, c)))
            except SdcpProblem as exc:
                return exc, rig.dialled, c
            raise AssertionError("the proposal was taken")

    problem, dialled, c = run(scenario(), timeout=60)
    assert isinstance(problem, SdcpProblem) and problem.suffix == "sdcp-q-unavailable"
    assert all(node != c for _, node in dialled)
