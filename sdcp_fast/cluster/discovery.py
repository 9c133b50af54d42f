"""How a router in a cluster learns its verifiers and drafters: from the membership registry
in etcd (:mod:`~sdcp_fast.cluster.membership`), not from a list of peers it was given.

An instance is a candidate of the router's while it is registered (its host keeps its lease
alive) and its status is live (§6.1): a status report from an instance that is not registered
is not taken, and an instance that leaves the registry (its host's lease expired: the host
died or was cut off from etcd) is withdrawn from the status table as if its status had
expired, so the sweep fails its sessions over (§6.9). A drafter's record names its kind;
its model digest, which contracts permit or not, is worked out once per kind. While etcd
cannot be read the last view stands: etcd being away is no reason to drop anyone.

:func:`peers_of`, :func:`departed` and :func:`admits` are pure; :class:`Discovery` reads
the registry and applies them to the router's status table.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from sdcp_fast.cluster.membership import Member
from sdcp_fast.protocol.status_table import StatusTable

log = logging.getLogger("sdcp_fast.router")


def _same(uri: str) -> str:
    return uri.rstrip("/")  # a base URI's trailing slash is not significant


@dataclass(frozen=True)
class Peers:
    """The registered instances a router may route to: verifiers, and drafters with their kind."""

    verifiers: frozenset[str] = frozenset()
    drafters: Mapping[str, str] = field(default_factory=dict)

    def all(self) -> frozenset[str]:
        return self.verifiers | frozenset(self.drafters)


def peers_of(members: Iterable[Member]) -> Peers:
    """The verifiers and drafters among ``members`` (routers and MLC nodes are not peers of a router's)."""
    members = list(members)
    return Peers(frozenset(m.uri for m in members if m.role == "verifier"),
                 {m.uri: m.model for m in members if m.role == "drafter"})


def admits(peers: Peers | None, instance: str) -> bool:
    """Whether a status report from ``instance`` is taken: it is registered (nobody is before
    the registry was first read)."""
    return peers is not None and _same(instance) in {_same(u) for u in peers.all()}


def departed(peers: Peers, reported: Iterable[str]) -> list[str]:
    """The instances of ``reported`` (those with a live status) that are no longer registered."""
    known = {_same(u) for u in peers.all()}
    return sorted(i for i in set(reported) if _same(i) not in known)


class Discovery:
    """The registry as a router sees it, every ``interval`` seconds. ``read`` lists the
    registered members (blocking: it runs on a worker thread); ``model_of`` turns a drafter's
    kind into its model digest (blocking too: it may load the drafter)."""

    def __init__(self, read: Callable[[], list[Member]], model_of: Callable[[str], bytes], *,
                 interval: float = 1.0) -> None:
        self.read, self.model_of, self.interval = read, model_of, interval
        self.peers: Peers | None = None
        self._models: dict[str, bytes] = {}

    def admits(self, instance: str) -> bool:
        return admits(self.peers, instance)

    async def refresh(self, table: StatusTable, now: float) -> list[str]:
        """Read the registry once and apply it to ``table``; the instances withdrawn."""
        peers = peers_of(await asyncio.to_thread(self.read))
        for uri, kind in peers.drafters.items():
            if kind and table.model_of(uri) is None:
                if kind not in self._models:
                    self._models[kind] = await asyncio.to_thread(self.model_of, kind)
                table.register_model(uri, self._models[kind])
        reported = [s.instance for s in (*table.live_verifiers(now), *table.live_drafters(now))]
        gone = departed(peers, reported)
        for instance in gone:
            log.warning("%s left the membership registry: withdrawn from the status table", instance)
            table.withdraw(instance)
        self.peers = peers
        return gone

    async def run(self, table: StatusTable, clock: Callable[[], float]) -> None:
        """:meth:`refresh` every ``interval`` seconds until cancelled."""
        while True:
            try:
                await self.refresh(table, clock())
            except Exception as exc:  # etcd away (a partition, a restart): the last view stands
                log.warning("membership registry not read: %s", exc)
            await asyncio.sleep(self.interval)
