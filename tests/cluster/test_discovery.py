"""Discovery (sdcp_fast/cluster/discovery.py): a router in a cluster takes its verifiers and
drafters from the membership registry. An instance that reports its status but is not
registered is no candidate; one that leaves the registry (its host's lease expired) is
withdrawn as if its status had expired, so its sessions fail over; a drafter's kind in its
record gives the model digest contracts permit."""

from __future__ import annotations

import pytest

from sdcp_fast.cluster.discovery import Discovery, Peers, admits, departed, peers_of
from sdcp_fast.cluster.membership import Member
from sdcp_fast.protocol.messages import ROLE_DRAFTER, ROLE_VERIFIER, Status
from sdcp_fast.protocol.problems import Busy
from sdcp_fast.roles.router import RouterRole, SessionSpec
from tests.roles.rolekit import (
    DRAFTER,
    PROMPT,
    ROUTER,
    ROUTER_PEER,
    SCOPE,
    TARGET,
    TOKENIZER,
    VERIFIER,
    VERIFIER_PEER,
    Clock,
    Rig,
    run,
    sid,
    status,
)


def member(role: str, uri: str, model: str = "") -> Member:
    return Member(role, f"{role}-x", "h1", uri, "00" * 32, model)


def test_peers_are_the_registered_verifiers_and_drafters_with_their_kind() -> None:
    peers = peers_of([member("verifier", "https://a:1/"), member("drafter", "https://b:2/", "ngram"),
                      member("router", "https://c:3/"), member("mlc", "https://d:4")])
    assert peers == Peers(frozenset({"https://a:1/"}), {"https://b:2/": "ngram"})
    assert admits(peers, "https://a:1") and admits(peers, "https://b:2/")  # a trailing slash is not significant
    assert not admits(peers, "https://c:3/") and not admits(None, "https://a:1/")
    assert departed(peers, ["https://a:1/", "https://e:5/"]) == ["https://e:5/"]


def test_a_router_takes_only_registered_instances_and_withdraws_those_that_leave(tmp_path) -> None:
    registry = [member("drafter", DRAFTER, "kind-a")]
    kinds: list[str] = []

    def model_of(kind: str) -> bytes:
        kinds.append(kind)
        return b"a" * 32

    async def scenario() -> None:
        async with Rig(str(tmp_path)) as rig:
            clock = Clock()
            discovery = Discovery(lambda: list(registry), model_of)
            router = RouterRole(uri=ROUTER, mlc=rig.store, transport=rig.network.transport(ROUTER_PEER),
                                target_digest=TARGET, tokenizer_digest=TOKENIZER, scope=SCOPE, clock=clock,
                                drafter_models={}, sweep_interval=0.01, discovery=discovery)
            rig.network.register(ROUTER, router.handler)
            verifier = rig.client(VERIFIER_PEER)
            await discovery.refresh(router.table, clock())
            assert router.table.model_of(DRAFTER) == b"a" * 32 and kinds == ["kind-a"]
            # The verifier reports, but no lease holds it in the registry: no candidate.
            await verifier.status(ROUTER, _status(VERIFIER, ROLE_VERIFIER))
            await rig.drafter.status(ROUTER, _status(DRAFTER, ROLE_DRAFTER))
            assert router.table.status(VERIFIER, clock()) is None
            with pytest.raises(Busy):
                await router.open(SessionSpec(PROMPT, max_new=4, session=sid(1)))
            registry.append(member("verifier", VERIFIER))
            await discovery.refresh(router.table, clock())
            await verifier.status(ROUTER, _status(VERIFIER, ROLE_VERIFIER))
            routed = await router.open(SessionSpec(PROMPT, max_new=4, session=sid(2)))
            assert routed.verifier == VERIFIER and routed.drafter == DRAFTER
            # Its host's lease expired: it leaves the registry, and the router withdraws it even
            # though its status has not expired, and takes no report of its any more.
            registry.pop()
            assert await discovery.refresh(router.table, clock()) == [VERIFIER]
            assert router.table.expired(VERIFIER, clock()) and router.table.live(DRAFTER, clock())
            await verifier.status(ROUTER, _status(VERIFIER, ROLE_VERIFIER))
            assert not router.table.live(VERIFIER, clock())
            # etcd away: the last view stands.
            view = discovery.peers
            discovery.read = _unreachable
            with pytest.raises(OSError):
                await discovery.refresh(router.table, clock())
            assert discovery.peers is view
            await rig.drafter.status(ROUTER, _status(DRAFTER, ROLE_DRAFTER))
            assert router.table.live(DRAFTER, clock())

    run(scenario())


def _unreachable() -> list[Member]:
    raise OSError("etcd unreachable")


def _status(instance: str, role: int) -> Status:
    return status(instance, role)
