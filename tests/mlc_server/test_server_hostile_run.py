"""A short hostile run against the server: abandoned uploads, lease
renewals, many log names and many small objects; memory and descriptors stay bounded.
Sized to finish well under a minute on a shared 2-core CI machine. It speaks raw HTTP/1.1 on
sockets, so it runs against the HTTP/1.1 server; the HTTP/2 server's abandoned uploads and
early refusals are in test_mlc_h2.py, its routes and checks in the parametrized tests."""

from __future__ import annotations

import http.client
import os
import socket
import time

import cbor2
import pytest

from sdcp_fast.cache import MLC, object_uri
from sdcp_fast.cache.tiers.disk import DiskTier
from sdcp_fast.cache.tiers.host import HostTier
from sdcp_fast.commitlog.directory import LogDirectory
from sdcp_fast.protocol.commitlog import FenceRecord, encode_record

from .serverkit import rss, serving

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads RSS and fds from /proc")
SCOPE = bytes(range(16))


def fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_memory_and_descriptors_stay_bounded_under_a_hostile_client(tmp_path):
    started = time.monotonic()
    logs = LogDirectory(str(tmp_path / "logroot"), max_open=8, sync=False)
    with MLC([HostTier(16 << 20), DiskTier(16 << 20, str(tmp_path))], max_objects=1000) as mlc, \
            serving(mlc, logs=logs) as base:
        port = int(base.rsplit(":", 1)[1])
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)

        def req(method: str, path: str, body: bytes | None = None, ctype: str | None = None) -> int:
            conn.request(method, path, body=body, headers={"Content-Type": ctype} if ctype else {})
            resp = conn.getresponse()
            resp.read()
            return resp.status

        def obj(n: int) -> str:
            return "/objects/" + object_uri(SCOPE, n.to_bytes(16, "big"), "q_rows", 1).removeprefix("mlc://")

        assert req("PUT", obj(0), b"warm-up") == 201
        before_rss, before_fds = rss(), fds()

        # Abandoned uploads: declared 64 MiB, 24 MiB sent, then the client vanishes.
        for _ in range(6):
            s = socket.create_connection(("127.0.0.1", port))
            s.sendall(f"PUT {obj(1)} HTTP/1.1\r\nHost: t\r\nContent-Length: {64 << 20}\r\n\r\n".encode())
            for _ in range(24):
                s.sendall(b"\x02" * (1 << 20))
            time.sleep(0.1)
            s.close()

        # One lease renewed thousands of times.
        conn.request("POST", "/leases", cbor2.dumps({"uri": "mlc://" + obj(0)[len("/objects/"):], "ttl_ms": 60000}),
                     {"Content-Type": "application/cbor"})
        resp = conn.getresponse()
        lease = cbor2.loads(resp.read())["lease"]
        renew = cbor2.dumps({"ttl_ms": 60000})
        for _ in range(3000):
            assert req("PUT", f"/leases/{lease}", renew, "application/cbor") == 204
        assert req("DELETE", f"/leases/{lease}") == 204

        # Many log names: reads of logs that do not exist, and appends to a few hundred.
        for n in range(1500):
            name = object_uri(SCOPE, n.to_bytes(16, "big"), "commit_log").removeprefix("mlc://")
            if n % 5 == 0:
                assert req("POST", f"/logs/{name}", encode_record(FenceRecord(1)), "application/cbor") == 201
            assert req("GET", f"/logs/{name}") == (200 if n % 5 == 0 else 404)

        # Many small objects with metadata, far more than the index holds.
        for n in range(2, 4002):
            body = cbor2.dumps({"data": b"", "meta": {"pad": "m" * 1024}})
            assert req("PUT", obj(n), body, "application/cbor") == 201
        conn.close()

        stats = mlc.stats()
        grown_rss, grown_fds = rss() - before_rss, fds() - before_fds
        assert stats["index"]["objects"] == 1000 and stats["leases"] == 0
        assert len(mlc._expiry) <= 64, "renewals left no trail in the expiry heap"
        assert logs.open_count <= 8
    logs.close()
    assert grown_fds <= 8 + 4, f"{grown_fds} more descriptors"
    assert grown_rss < 64 << 20, f"RSS grew {grown_rss >> 20} MiB"
    assert time.monotonic() - started < 60
