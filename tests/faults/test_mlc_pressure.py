"""The MLC server under hostile clients at once, over HTTP/1.1 (where a stalled upload's timeout
can be shortened; HTTP/2's bounds are in tests/mlc_server/test_server_h2.py): metadata that decodes
to far more than its bytes, scopes that come and go, uploads that stall, leases taken and
released, large commit records. Meanwhile a well-behaved client's leased objects and commit
log must come through whole, the server must answer a probe throughout, and the process
must stay within what its bounds allow.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import threading
import time

import pytest

from sdcp_fast.cache import object_uri
from sdcp_fast.cache.index import MLC
from sdcp_fast.cache.tiers.disk import DiskTier
from sdcp_fast.cache.tiers.host import HostTier
from sdcp_fast.commitlog.directory import LogDirectory
from sdcp_fast.protocol import cbor
from sdcp_fast.protocol.commitlog import CommitRecord, decode_log, encode_record
from tests.mlc_server.serverkit import rss, serving

MiB = 1 << 20
INDEX = 24 * MiB
SCOPES = 300
META_PUTS = 60
STALLED = 4
LEASES = 200


def _name(scope: int, n: int) -> str:
    return object_uri(scope.to_bytes(16, "big"), b"p" * 16, "q_rows", n).removeprefix("mlc://")


def _log(scope: int, n: int) -> str:
    return object_uri(scope.to_bytes(16, "big"), n.to_bytes(16, "big"), "commit_log").removeprefix("mlc://")


class Client:
    def __init__(self, port: int) -> None:
        self.port = port
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)

    def __call__(self, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None
                 ) -> tuple[int, bytes, dict[str, str]]:
        self.conn.request(method, path, body=body, headers=headers or {})
        resp = self.conn.getresponse()
        return resp.status, resp.read(), {k.lower(): v for k, v in resp.getheaders()}


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads RSS from /proc/self/statm")
def test_hostile_clients_leave_the_mlc_bounded_responsive_and_losing_nothing(tmp_path):
    logs = LogDirectory(str(tmp_path / "logs"), sync=False)
    with MLC([HostTier(16 * MiB), DiskTier(16 * MiB, str(tmp_path))], index_bytes=INDEX, max_scopes=128) as mlc, \
            serving(mlc, logs=logs, inflight_bytes=16 * MiB, request_timeout=1.0) as base:
        port = int(base.rsplit(":", 1)[1])
        good = Client(port)
        kept = {n: os.urandom(256 << 10) for n in range(4)}
        for n, data in kept.items():
            status, body, _ = good("PUT", f"/objects/{_name(1, n)}?lease_ms=3600000", data)
            assert status == 201, body
        log_path = f"/logs/{_log(1, 0)}"
        for r in range(20):
            status, body, _ = good("POST", log_path, encode_record(CommitRecord(1, r, (r,), r, bytes(32))),
                                   {"content-type": "application/cbor"})
            assert status == 201, body
        rss_before = rss()

        probe_worst, stop = [0.0], threading.Event()

        def probe() -> None:
            c = Client(port)
            while not stop.is_set():
                t0 = time.monotonic()
                assert c("GET", "/stats")[0] == 200
                probe_worst[0] = max(probe_worst[0], time.monotonic() - t0)
                time.sleep(0.05)

        prober = threading.Thread(target=probe)
        prober.start()
        hostile = Client(port)
        answers: dict[int, int] = {}
        try:
            stalled = []
            for n in range(STALLED):  # 2 MiB of an 8 MiB body each, then nothing
                s = socket.create_connection(("127.0.0.1", port))
                s.sendall(f"PUT /objects/{_name(2, n)} HTTP/1.1\r\nHost: t\r\nContent-Length: {8 * MiB}\r\n\r\n"
                          .encode() + b"\x07" * (2 * MiB))
                stalled.append(s)
            meta = cbor.deterministic_cbor({"data": b"m", "meta": {"k": [[]] * 10000}})
            for n in range(META_PUTS):  # 10 KB of CBOR, ~0.65 MB decoded, each
                status = hostile("PUT", f"/objects/{_name(3, n)}", meta, {"content-type": "application/cbor"})[0]
                answers[status] = answers.get(status, 0) + 1
            for s in range(SCOPES):  # a scope each, put and deleted
                for method in ("PUT", "DELETE"):
                    status = hostile(method, f"/objects/{_name(1000 + s, 0)}", b"x" * 64)[0]
                    answers[status] = answers.get(status, 0) + 1
            for _ in range(LEASES):  # hour-long leases, released at once
                _, body, _ = hostile("POST", "/leases", cbor.deterministic_cbor(
                    {"uri": "mlc://" + _name(1, 0), "ttl_ms": 3600000}), {"content-type": "application/cbor"})
                lease = cbor.decode(body)["lease"]
                assert hostile("DELETE", f"/leases/{lease}")[0] == 204
            big = encode_record(CommitRecord(1, 100, tuple(range(1000, 61000)), 100, bytes(32)))
            for n in range(3):
                status = hostile("POST", f"/logs/{_log(4, n)}", big,
                                 {"content-type": "application/cbor"})[0]
                answers[status] = answers.get(status, 0) + 1
            timed_out = 0
            for s in stalled:
                s.settimeout(10)
                timed_out += s.recv(4096).startswith(b"HTTP/1.1 408")
                s.close()
        finally:
            stop.set()
            prober.join(30)
        grown = rss() - rss_before

        for n, data in kept.items():  # nothing the good client holds is lost
            status, body, _ = good("GET", f"/objects/{_name(1, n)}")
            assert status == 200 and body == data
        status, body, headers = good("GET", log_path)
        assert status == 200 and headers["etag"] == '"20"'
        assert [r.round for r in decode_log(body)] == list(range(20))
        stats = mlc.stats()
        figures = {
            "rss_growth_mib": round(grown / MiB, 1), "probe_worst_s": round(probe_worst[0], 3),
            "answers": answers, "stalled_408": timed_out, "index_bytes": stats["index"]["bytes"],
            "scope_rows": len(stats["scopes"]), "expiry_heap": len(mlc._expiry), "leases": stats["leases"],
        }
        print("mlc-pressure", json.dumps(figures))
        assert timed_out == STALLED
        assert answers.get(201, 0) + answers.get(204, 0) == META_PUTS + 2 * SCOPES + 3
        assert stats["index"]["bytes"] <= INDEX
        assert len(stats["scopes"]) <= 129 and len(mlc._expiry) <= 2 * stats["leases"] + 64
        # The index bounds what the metadata holds; uploads in flight (16 MiB) are given back.
        assert grown < INDEX + 40 * MiB, figures
        assert probe_worst[0] < 2.0, figures
    logs.close()
