"""How the kit reaches what the draft leaves to the deployment: the cache that serves q rows
and committed tokens (§1.4: "a multi-level cache that stores and serves opaque objects named
by URI"), and the commit log it fences (§6.8).

The draft defines neither the cache's API nor its names, nor the encoding of a
``committed_tokens`` object, so the kit takes them from a :class:`Store`: an object with these
coroutines (any class will do; the kit calls only these):

- ``commit_log(scope, session) -> str``: the commit_log reference for a session-open;
- ``put(scope, session, kind, round, data) -> str``: store ``data`` (q rows: V little-endian
  binary32 per position, §5.2; or committed tokens) and return the cache-ref to send;
- ``missing(scope, session, kind, round) -> str``: a cache-ref that names nothing;
- ``tokens(tokens) -> bytes``: a ``committed_tokens`` object's bytes;
- ``fence(ref, epoch)``: append a fence record of ``epoch`` to the commit log ``ref`` (None in
  ``fence_supported`` = False stores: §6.8 is then not reachable).

:class:`MlcStore` is sdcp_fast's store (``--mlc URL``: ``mlc://`` names, uint32 network-order
token objects, its commit-log API); ``--store module:factory`` names another
(docs/conformance.md).
"""

from __future__ import annotations

import importlib
import struct
from collections.abc import Sequence
from typing import Any


class MlcStore:
    """sdcp_fast's store (:class:`sdcp_fast.store.Store`: the embedded one, or an ``sdcp-fast
    mlc`` server through :class:`~sdcp_fast.store.RemoteStore`): ``mlc://<scope>/<session>/
    <kind>[/<round>]`` names (docs/mlc.md), token objects as uint32 in network byte order.
    Draft objects (q rows) are written through ``store`` (the drafter's identity); committed
    tokens and fences through ``control`` (the router's, who names them and fences in §6.9;
    default ``store``)."""

    DRAFT_KINDS = frozenset({"q_rows", "draft_kv", "prompt_kv"})

    def __init__(self, store: Any, control: Any = None) -> None:
        self.store = store
        self.control = control if control is not None else store
        self.fence_supported = store is not None

    def describe(self) -> str:
        return ("q rows, committed tokens and fences through sdcp_fast's MLC API (mlc://<scope>/<session>/<kind> "
                "names, uint32 token objects, its commit-log append), which the draft does not define (§1.4); "
                "--store names another deployment's")

    @staticmethod
    def name(scope: bytes, session: bytes, kind: str, round: int | None = None) -> str:
        from sdcp_fast.cache.uri import object_uri

        return object_uri(scope, session, kind, round)

    def commit_log(self, scope: bytes, session: bytes) -> str:
        return self.name(scope, session, "commit_log")

    async def put(self, scope: bytes, session: bytes, kind: str, round: int, data: bytes) -> str:
        uri = self.name(scope, session, kind, round)
        await (self.store if kind in self.DRAFT_KINDS else self.control).put(uri, data)
        return uri

    def missing(self, scope: bytes, session: bytes, kind: str, round: int) -> str:
        return self.name(scope, session, kind, 900_000 + round)

    @staticmethod
    def tokens(tokens: Sequence[int]) -> bytes:
        return struct.pack(f">{len(tokens)}I", *tokens)

    async def fence(self, ref: str, epoch: int) -> None:
        from sdcp_fast.protocol.commitlog import FenceRecord

        log = await self.control.commit_log(ref)
        await log.append(FenceRecord(epoch), None)

    async def aclose(self) -> None:
        for store in {id(s): s for s in (self.store, self.control) if s is not None}.values():
            await store.aclose()


class NamesOnly(MlcStore):
    """No cache reachable: commit logs are still named the MLC way (a verifier needs a name in
    every session-open); rule-2, resume and fencing checks are not reachable."""

    def __init__(self) -> None:
        super().__init__(None)

    def describe(self) -> str:
        return ("no store (--mlc or --store): rule 2, resume and fencing are not reachable; commit logs are "
                "named mlc://<scope>/<session>/commit_log")

    async def put(self, scope: bytes, session: bytes, kind: str, round: int, data: bytes) -> str:
        raise NotImplementedError


def remote_mlc_store(url: str, drafter_ssl: Any, router_ssl: Any) -> MlcStore:
    """The ``sdcp-fast mlc`` server at ``url``: q rows put as the drafter, the rest as the router."""
    from sdcp_fast.store import RemoteStore

    return MlcStore(RemoteStore(url, ssl=drafter_ssl), RemoteStore(url, ssl=router_ssl))


def load_store(spec: str) -> Any:
    """``module:factory`` -> ``factory()``, a user's :class:`Store`."""
    module, _, attr = spec.partition(":")
    if not attr:
        raise ValueError(f"--store {spec!r}: expected module:factory")
    return getattr(importlib.import_module(module), attr)()


__all__ = ["MlcStore", "NamesOnly", "load_store", "remote_mlc_store"]
