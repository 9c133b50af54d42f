"""The routers' routing records in etcd, in a cluster (docs/interpretations.md, "Routing
records"): the object a router would put in the MLC under ``mlc://<scope>/<id>/routing`` is
the value of the key ``/sdcp/<cluster>/records/<that URI>``, on the cluster's etcd members
(any one that answers), so a router or an MLC node can die without taking them along.

A session's commit log lives there too: :func:`commit_log_ref` names it as an etcd log
(:mod:`sdcp_fast.commitlog.etcd`) under ``/sdcp/<cluster>/logs/``, on ``127.0.0.1``: every
host of the cluster runs a member, so each role reaches the log through its own host's one.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Sequence
from typing import Any

from sdcp_fast.cache.failures import ObjectUnavailable
from sdcp_fast.cluster.etcd_client import EtcdClient, b64
from sdcp_fast.cluster.membership import ROOT
from sdcp_fast.protocol.messages import session_path_id


def commit_log_ref(cluster: str, port: int, scope: bytes, session: bytes) -> str:
    """The commit log of ``session`` (of the routers' ``scope``) in ``cluster``'s etcd."""
    return f"etcd://127.0.0.1:{port}{ROOT}{cluster}/logs/{scope.hex()}/{session_path_id(session)}"


class EtcdRecords:
    """``put`` and ``get`` of routing records (the part of the store a router's record store
    uses), on etcd; blocking calls run on a worker thread."""

    def __init__(self, cluster: str, endpoints: Sequence[tuple[str, int]], *, timeout: float = 3.0) -> None:
        self.prefix = f"{ROOT}{cluster}/records/"
        self._etcd = EtcdClient(endpoints, timeout=timeout)

    def _key(self, uri: str) -> str:
        return self.prefix + uri

    async def put(self, uri: str, data: Any, lease_ttl: float | None = None) -> str | None:
        value = bytes(data)
        await asyncio.to_thread(self._etcd.call, "/v3/kv/put", {"key": b64(self._key(uri)), "value": b64(value)})
        return None

    async def get(self, uri: str) -> memoryview:
        out = await asyncio.to_thread(self._etcd.call, "/v3/kv/range", {"key": b64(self._key(uri))})
        kvs = out.get("kvs", [])
        if not kvs:
            raise ObjectUnavailable(f"no routing record {uri} in etcd")
        return memoryview(base64.b64decode(kvs[0].get("value", "")))

    def close(self) -> None:
        self._etcd.close()
