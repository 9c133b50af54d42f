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
import json
import time
import urllib.request
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from sdcp_fast.cache.failures import ObjectUnavailable
from sdcp_fast.cluster.etcd_client import EtcdClient, b64
from sdcp_fast.cluster.membership import ROOT, range_end
from sdcp_fast.protocol.messages import session_path_id
from sdcp_fast.protocol.routing import RoutedSession
from sdcp_fast.protocol.routing_records import decode_record

if TYPE_CHECKING:
    from sdcp_fast.cluster.spec import ClusterSpec

# A member asked whether the cluster takes writes answers within this, or is taken for lost: a
# stopped one takes the connection and never answers.
HEALTH_TIMEOUT_S = 1.5
# One answer serves the opens of this long, so that a burst of them asks the members once.
HEALTH_KEPT_S = 1.0


def commit_log_ref(cluster: str, port: int, scope: bytes, session: bytes) -> str:
    """The commit log of ``session`` (of the routers' ``scope``) in ``cluster``'s etcd."""
    return f"etcd://127.0.0.1:{port}{ROOT}{cluster}/logs/{scope.hex()}/{session_path_id(session)}"


def routed_sessions(spec: ClusterSpec) -> list[RoutedSession]:
    """The sessions whose routing records ``spec``'s etcd holds (the routers' indexes left out):
    what the fault tests and benches across hosts look sessions up in."""
    etcd = EtcdClient(spec.etcd_clients())
    start = f"{ROOT}{spec.token}/records/"
    try:
        out = etcd.call("/v3/kv/range", {"key": b64(start), "range_end": b64(range_end(start))})
    finally:
        etcd.close()
    found = []
    for kv in out.get("kvs", []):
        try:
            found.append(decode_record(base64.b64decode(kv["value"])))
        except ValueError:
            continue  # a router's index, not a session's record
    return found


def new_session(spec: ClusterSpec, before: set[bytes], timeout: float = 30.0) -> RoutedSession:
    """The first session not in ``before`` and not ended whose routing record etcd holds, once
    it shows (a router writes it after the session opened)."""
    deadline = time.monotonic() + timeout
    while not (mine := [s for s in routed_sessions(spec) if s.session not in before and not s.done]):
        if time.monotonic() > deadline:
            raise TimeoutError("the session's routing record never showed in etcd")
        time.sleep(0.05)
    return mine[0]


class EtcdRecords:
    """``put`` and ``get`` of routing records (the part of the store a router's record store
    uses), on etcd; blocking calls run on a worker thread."""

    def __init__(self, cluster: str, endpoints: Sequence[tuple[str, int]], *, timeout: float = 3.0) -> None:
        self.prefix = f"{ROOT}{cluster}/records/"
        self.endpoints = list(endpoints)
        self._etcd = EtcdClient(endpoints, timeout=timeout)
        self._health: tuple[float, str | None] = (float("-inf"), None)

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

    async def refusal(self) -> str | None:
        """Why a new session's commit log and routing record cannot be written now, or None.
        etcd takes writes only while a quorum of its members is up, and a member's ``/health``
        is true only then (3.4: it has a leader and a read through the quorum answered), false
        at once otherwise. Every member is asked at once, each for at most
        ``HEALTH_TIMEOUT_S``: a write would wait about 7 s for etcd's own timeout, per member."""
        at, why = self._health
        if time.monotonic() - at < HEALTH_KEPT_S:
            return why
        answers = await asyncio.gather(*(asyncio.to_thread(_healthy, host, port) for host, port in self.endpoints))
        why = None if any(answers) else (f"no etcd member of {len(self.endpoints)} has a quorum "
                                         "(the cluster's commit logs and routing records cannot be written)")
        self._health = (time.monotonic(), why)
        return why

    def close(self) -> None:
        self._etcd.close()


def _healthy(host: str, port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/health", timeout=HEALTH_TIMEOUT_S) as r:
            return json.loads(r.read()).get("health") in ("true", True)
    except (OSError, ValueError):
        return False
