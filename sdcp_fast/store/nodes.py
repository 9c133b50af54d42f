"""The store of a role in a cluster of MLC nodes, one per host: its own host's node for what it
writes, and the node a name names for what it reads (docs/interpretations.md, "MLC nodes in
object names").

A name that names a node (``mlc://<host>:<port>/<scope>/...``, :mod:`sdcp_fast.cache.uri`)
is read, leased and deleted at that node, under its plain name; a plain name is the home
node's, and a plain name the home node does not hold is looked for at the other nodes (the
names readers make up themselves, such as an epoch's ``committed_tokens``, name no node).
:meth:`NodeStore.located` is the name other hosts reach an object of the home node by.

Only nodes the cluster knows are dialled: ``known`` lists the MLC nodes' base URIs (read
from the membership registry; blocking, so it runs on a worker thread, at most once per
``reread_s`` on demand). Any other node is :class:`UnknownNode`, an
:class:`~sdcp_fast.cache.failures.ObjectUnavailable`: a verifier answers the proposal that
named it with sdcp-q-unavailable. ``open_node`` reaches a node over the cluster's mutual TLS.

A lease is the node's that holds the object: one taken at another node than home is
returned as ``<lease>@<host>:<port>`` and released there. Commit logs are the home node's
(or their own backend's, etcd in a cluster).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, TypeVar

from sdcp_fast.cache.failures import ObjectUnavailable
from sdcp_fast.cache.index import Head
from sdcp_fast.cache.uri import at_node, local_name, node_authority, node_base, node_of
from sdcp_fast.store.interface import Log, LogAppend, Store

T = TypeVar("T")
log = logging.getLogger("sdcp_fast.store")


class UnknownNode(ObjectUnavailable):
    """A name or lease names a node that is not one of the cluster's MLC nodes."""

    suffix = "mlc-unknown-node"
    status = 404
    title = "Object names a node the cluster does not know"


class NodeStore:
    """:class:`~sdcp_fast.store.interface.Store` over the MLC nodes of a cluster, ``home``
    (a base URI) the role's own host's."""

    def __init__(self, home: str, open_node: Callable[[str], Store], known: Callable[[], Iterable[str]], *,
                 reread_s: float = 1.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.home = node_authority(home)
        self._open, self._known_fn, self._reread_s, self._clock = open_node, known, reread_s, clock
        self._stores: dict[str, Store] = {self.home: open_node(node_base(self.home))}
        self._known: frozenset[str] = frozenset()
        self._read_at: float | None = None

    def located(self, uri: str) -> str:
        """``uri`` as other hosts name it once this store holds it: at the home node."""
        return at_node(uri, self.home) if node_of(uri) is None else uri

    async def known(self, *, fresh: bool = False) -> frozenset[str]:
        """The cluster's nodes as last read (again with ``fresh`` when the last read is older
        than ``reread_s``). A registry that cannot be read leaves the last view."""
        now = self._clock()
        if self._read_at is None or (fresh and now - self._read_at >= self._reread_s):
            self._read_at = now
            try:
                nodes = await asyncio.to_thread(lambda: list(self._known_fn()))
            except Exception as exc:  # etcd away: the nodes known stay known, no other is
                log.warning("MLC nodes not read from the registry: %s", exc)
                return self._known | {self.home}
            known = set()
            for base in nodes:
                with contextlib.suppress(ValueError):  # a record nobody can dial is nobody
                    known.add(node_authority(base))
            self._known = frozenset(known)
        return self._known | {self.home}

    async def node(self, node: str) -> Store:
        """The store of ``node``, one the cluster knows (UnknownNode otherwise)."""
        store = self._stores.get(node)
        if store is not None:
            return store
        if node not in await self.known() and node not in await self.known(fresh=True):
            raise UnknownNode(f"{node} is not an MLC node of this cluster")
        return self._stores.setdefault(node, self._open(node_base(node)))

    async def _at(self, uri: str) -> tuple[str, Store, str]:
        """The node ``uri`` names (home for a plain name), its store and the plain name."""
        node = node_of(uri) or self.home
        return node, await self.node(node), local_name(uri)

    async def put(self, uri: str, data: Any, lease_ttl: float | None = None) -> str | None:
        node, store, name = await self._at(uri)
        lease = await store.put(name, data, lease_ttl)
        return lease if lease is None or node == self.home else f"{lease}@{node}"

    async def get(self, uri: str) -> memoryview:
        return await self._read(uri, lambda store, name: store.get(name))

    async def head(self, uri: str) -> Head:
        return await self._read(uri, lambda store, name: store.head(name))

    async def _read(self, uri: str, call: Callable[[Store, str], Awaitable[T]]) -> T:
        """``call`` at the node ``uri`` names; for a plain name the home node first, then
        the other nodes together (the first that holds it answers)."""
        node, store, name = await self._at(uri)
        try:
            return await call(store, name)
        except ObjectUnavailable:
            if node_of(uri) is not None:
                raise
            missing = ObjectUnavailable(f"{uri} is on none of the cluster's nodes")
        others = sorted(await self.known(fresh=True) - {self.home})
        return await _first([call(await self.node(n), name) for n in others], missing)

    async def delete(self, uri: str) -> None:
        _, store, name = await self._at(uri)
        await store.delete(name)

    async def release(self, lease: str, *, drop: bool = False) -> None:
        lease_id, at, node = lease.partition("@")
        store = await self.node(node_authority(node)) if at else self._stores[self.home]
        await store.release(lease_id, drop=drop)

    async def commit_log(self, ref: str) -> Log:
        return await self._stores[self.home].commit_log(ref)

    async def append_batch(self, entries: Sequence[LogAppend]) -> list[str | Exception]:
        return await self._stores[self.home].append_batch(entries)

    async def aclose(self) -> None:
        stores, self._stores = list(self._stores.values()), {}
        for store in stores:
            with contextlib.suppress(Exception):
                await store.aclose()


async def _first(calls: list[Awaitable[T]], missing: ObjectUnavailable) -> T:
    """The first answer of ``calls``, run together; the rest are cancelled. ``missing`` when
    none answers (a node without the object, or one that cannot be reached)."""
    pending = {asyncio.ensure_future(c) for c in calls}
    try:
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                if task.exception() is None:
                    return task.result()
    finally:
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    raise missing


def located(store: Store, uri: str) -> str:
    """The name other hosts reach ``uri`` by once ``store`` holds it: at its node where the
    store is one node of several (:class:`NodeStore`), ``uri`` itself otherwise."""
    return store.located(uri) if isinstance(store, NodeStore) else uri
