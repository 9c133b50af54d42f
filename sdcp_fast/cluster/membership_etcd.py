"""Membership in etcd: register instances under leases, renew them, list who is alive.

``endpoints`` are the members' client addresses; a call that cannot reach one member goes
to the next (:class:`~sdcp_fast.cluster.etcd_client.EtcdClient`), so losing one member of
three changes nothing here.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Any

from sdcp_fast.cluster.etcd_client import EtcdClient
from sdcp_fast.cluster.etcd_client import b64 as _b64
from sdcp_fast.cluster.membership import Member, decode, encode, key, prefix, range_end
from sdcp_fast.commitlog.etcd import EtcdError


class Membership:
    def __init__(self, cluster: str, endpoints: Sequence[tuple[str, int]], *, timeout: float = 3.0) -> None:
        self.cluster = cluster
        self._etcd = EtcdClient(endpoints, timeout=timeout)

    def _call(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._etcd.call(path, body)

    def grant(self, ttl_s: int) -> str:
        """A new lease of ``ttl_s`` seconds; its ID."""
        return str(self._call("/v3/lease/grant", {"TTL": ttl_s})["ID"])

    def keep_alive(self, lease: str) -> bool:
        """Renew ``lease``; False when etcd no longer has it (expired or revoked)."""
        out = self._call("/v3/lease/keepalive", {"ID": lease})
        return int(out.get("result", {}).get("TTL", 0)) > 0

    def revoke(self, lease: str) -> None:
        """End ``lease`` and delete its keys (a lease already gone is no error)."""
        try:
            self._call("/v3/kv/lease/revoke", {"ID": lease})
        except EtcdError as exc:
            if "lease not found" not in str(exc):
                raise

    def register(self, member: Member, lease: str) -> None:
        self._call("/v3/kv/put", {"key": _b64(key(self.cluster, member)), "value": _b64(encode(member)),
                                  "lease": lease})

    def members(self, role: str | None = None) -> list[Member]:
        """The registered instances (``role``'s only if given), ordered by key. A record that
        does not decode is left out: it is nobody the cluster can talk to."""
        start = prefix(self.cluster, role)
        out = self._call("/v3/kv/range", {"key": _b64(start), "range_end": _b64(range_end(start))})
        found = []
        for kv in out.get("kvs", []):
            try:
                found.append(decode(base64.b64decode(kv.get("value", ""))))
            except ValueError:
                continue
        return found

    def close(self) -> None:
        self._etcd.close()
