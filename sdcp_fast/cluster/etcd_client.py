"""A client of a cluster's etcd members: each call goes to the member that answered last,
and to the next one where it cannot be reached, so losing one member of three changes
nothing to its callers (membership, discovery, routing records).

Spoken over etcd's JSON gateway with the commit log's client
(:class:`~sdcp_fast.commitlog.etcd.EtcdGateway`); blocking, so async callers run it on a
worker thread.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Any

from sdcp_fast.commitlog.etcd import EtcdError, EtcdGateway


def b64(text: str | bytes) -> str:
    return base64.b64encode(text.encode() if isinstance(text, str) else text).decode()


def parse_endpoints(text: str) -> list[tuple[str, int]]:
    """``HOST:PORT[,HOST:PORT...]`` (ValueError names what is wrong)."""
    out = []
    for part in (p.strip() for p in text.split(",")):
        host, sep, port = part.rpartition(":")
        if not part or not sep or not host or not port.isdigit():
            raise ValueError(f"expected HOST:PORT[,HOST:PORT...], got {text!r}")
        out.append((host, int(port)))
    return out


class EtcdClient:
    def __init__(self, endpoints: Sequence[tuple[str, int]], *, timeout: float = 3.0) -> None:
        if not endpoints:
            raise ValueError("no etcd endpoint")
        self._gateways = [EtcdGateway(host, port, timeout=timeout) for host, port in endpoints]

    def call(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        failure: Exception | None = None
        for i, gateway in enumerate(self._gateways):
            try:
                out = gateway.call(path, body)
            except (OSError, EtcdError) as exc:
                failure = exc
                continue
            if i:  # the one that answered is asked first from now on
                self._gateways.insert(0, self._gateways.pop(i))
            return out
        raise EtcdError(f"no etcd member answered {path}: {failure}")

    def close(self) -> None:
        for gateway in self._gateways:
            gateway.close()
