"""The MLC server under a hostile client: consistent reads, bounded memory and
descriptors, problems for bad input, and large bodies kept off the event loop. The ``server``
tests run against the HTTP/2 server and the HTTP/1.1 one; those that speak raw HTTP/1.1
on a socket (bodies cut off, abandoned or dawdling) run against the HTTP/1.1 server, whose
adapter streams bodies in (the HTTP/2 transport takes a whole body before the handler runs)."""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import socket
import threading
import time

import cbor2
import pytest

from sdcp_fast.cache import MLC, object_uri
from sdcp_fast.cache.tiers.disk import DiskTier
from sdcp_fast.cache.tiers.host import HostTier
from sdcp_fast.commitlog.directory import LogDirectory

from .serverkit import WIRES, rss_growth_over_abandoned_uploads, serving

SCOPE = bytes(range(16))
PROBLEM = "application/problem+json"


def name(n: int, kind: str = "q_rows") -> str:
    return object_uri(SCOPE, b"s" * 16, kind, n).removeprefix("mlc://")


def log_name(n: int) -> str:
    return object_uri(SCOPE, n.to_bytes(16, "big"), "commit_log").removeprefix("mlc://")


@pytest.fixture
def logs(tmp_path):
    d = LogDirectory(str(tmp_path / "logroot"), max_open=8, sync=False)
    yield d
    d.close()


@pytest.fixture(params=WIRES)
def server(request, tmp_path, logs):
    with MLC([HostTier(8 << 20), DiskTier(64 << 20, str(tmp_path))]) as mlc, \
            serving(mlc, logs=logs, http2=request.param == "h2") as base:
        yield base, mlc


@pytest.fixture
def server1(tmp_path, logs):
    """The HTTP/1.1 server alone, for raw-socket tests."""
    with MLC([HostTier(8 << 20), DiskTier(64 << 20, str(tmp_path))]) as mlc, serving(mlc, logs=logs) as base:
        yield base, mlc


def port_of(base: str) -> int:
    return int(base.rsplit(":", 1)[1])


def call(base: str, method: str, path: str, body: bytes | None = None,
         headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    if not base.http1:  # type: ignore[attr-defined]
        resp = base.fetch(method, path, body or b"", headers)  # type: ignore[attr-defined]
        return resp.status, dict(resp.headers), resp.body
    conn = http.client.HTTPConnection("127.0.0.1", port_of(base), timeout=30)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def assert_problem(answer: tuple[int, dict[str, str], bytes], status: int) -> dict:
    got, headers, body = answer
    assert got == status, (got, body[:300])
    assert headers["content-type"].startswith(PROBLEM)
    doc = json.loads(body)
    assert doc["status"] == status
    return doc


# -- 2. an entity tag always describes the bytes it comes with ------------------------------

def test_get_racing_puts_never_pairs_one_versions_tag_with_anothers_bytes(server):
    base, _ = server
    size = 512 << 10
    tags: dict[str, int] = {}  # etag -> version written under it
    seen: list[tuple[str, int]] = []
    stop = threading.Event()
    versions = iter(range(1, 1 << 30))
    lock = threading.Lock()

    def writer() -> None:
        while not stop.is_set():
            with lock:
                v = next(versions)
            status, headers, _ = call(base, "PUT", f"/objects/{name(1)}", v.to_bytes(8, "big") * (size // 8))
            assert status == 201
            with lock:
                tags[headers["etag"]] = v

    threads = [threading.Thread(target=writer) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        deadline = time.monotonic() + 8
        while len(seen) < 150 and time.monotonic() < deadline:
            status, headers, body = call(base, "GET", f"/objects/{name(1)}")
            if status == 200:
                assert len(set(body[i:i + 8] for i in range(0, len(body), 8))) == 1, "one version's bytes"
                seen.append((headers["etag"], int.from_bytes(body[:8], "big")))
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert len(seen) >= 20
    wrong = [(tag, v, tags.get(tag)) for tag, v in seen if tags.get(tag) != v]
    assert not wrong, f"{len(wrong)} of {len(seen)} GETs paired a tag with other bytes: {wrong[:3]}"


# -- 3. abandoned uploads and oversized declarations --------------------------------------

def _abandon(base: str, declared: int, sent: int) -> None:
    s = socket.create_connection(("127.0.0.1", port_of(base)))
    s.sendall(f"PUT /objects/{name(2)} HTTP/1.1\r\nHost: t\r\nContent-Length: {declared}\r\n\r\n".encode())
    chunk = b"\x01" * (1 << 20)
    for _ in range(sent >> 20):
        s.sendall(chunk)
    time.sleep(0.2)  # let the server take it in before the client vanishes
    s.close()


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads RSS from /proc/self/statm")
def test_abandoned_uploads_free_their_buffers_without_the_cycle_collector(server1, caplog):
    base, mlc = server1
    # What the old server leaked sat in a reference cycle: prove nothing waits for one.
    grown = rss_growth_over_abandoned_uploads(lambda declared, sent: _abandon(base, declared, sent),
                                              collect_cycles=False)
    assert grown < 48 << 20, f"RSS grew {grown >> 20} MiB over four abandoned 48 MiB uploads"
    assert mlc.stats()["index"]["objects"] == 0
    assert not [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL") and r.name.startswith("sdcp")], \
        "an abandoned upload is not a server error"


def test_a_declared_length_over_the_limit_is_refused_before_the_body(server1):
    base, _ = server1
    s = socket.create_connection(("127.0.0.1", port_of(base)))
    s.settimeout(5)
    s.sendall(f"PUT /objects/{name(3)} HTTP/1.1\r\nHost: t\r\nContent-Length: {3 << 30}\r\n\r\n".encode())
    head = s.recv(4096)  # no body sent: an answer can only come from the declared length
    s.close()
    assert head.startswith(b"HTTP/1.1 413") and PROBLEM.encode() in head


def test_a_body_over_the_limit_without_a_length_is_cut_off(server1, monkeypatch):
    import sdcp_fast.mlc_server.server as srv

    base, mlc = server1
    monkeypatch.setattr(srv, "MAX_BODY", 1 << 20)
    s = socket.create_connection(("127.0.0.1", port_of(base)))
    s.settimeout(10)
    s.sendall(f"PUT /objects/{name(4)} HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n".encode())
    chunk = b"\x00" * (256 << 10)
    try:
        for _ in range(8):
            s.sendall(b"%x\r\n" % len(chunk) + chunk + b"\r\n")
    except OSError:
        pass  # the server may close as soon as it has answered
    head = s.recv(4096)
    s.close()
    assert head.startswith(b"HTTP/1.1 413") and PROBLEM.encode() in head
    assert not mlc.contains("mlc://" + name(4))


# -- 6. logs: a read creates nothing, descriptors stay bounded -----------------------------

def test_reading_logs_that_do_not_exist_is_404_and_creates_nothing(server, logs):
    base, _ = server
    call(base, "GET", "/stats")  # the client's own connection (and loop) opened before counting
    fds = len(os.listdir("/proc/self/fd"))
    for n in range(300):
        assert_problem(call(base, "GET", f"/logs/{log_name(n)}"), 404)
    assert not os.path.exists(os.path.join(logs.root, "logs")) or not os.listdir(os.path.join(logs.root, "logs"))
    assert len(os.listdir("/proc/self/fd")) <= fds + 2
    from sdcp_fast.commitlog.http import HttpCommitLog

    log = HttpCommitLog(f"{base}/logs/{log_name(1)}", http1=base.http1)
    assert log.read().etag == '"0"', "the client reads a log nobody appended to as empty"
    log.close()


def test_many_logs_hold_at_most_max_open_descriptors(server, logs):
    base, _ = server
    from sdcp_fast.protocol.commitlog import FenceRecord, encode_record

    call(base, "GET", "/stats")  # the client's own connection (and loop) opened before counting
    fds = len(os.listdir("/proc/self/fd"))
    for n in range(100):
        status, _, _ = call(base, "POST", f"/logs/{log_name(n)}", encode_record(FenceRecord(1)),
                            {"Content-Type": "application/cbor"})
        assert status == 201
        assert call(base, "GET", f"/logs/{log_name(n)}")[0] == 200
    assert logs.open_count <= logs.max_open
    assert len(os.listdir("/proc/self/fd")) <= fds + logs.max_open + 2


# -- 7. large bodies are encoded and decoded off the event loop -----------------------------

def test_large_cbor_bodies_are_encoded_and_decoded_off_the_loop(server, monkeypatch):
    import sdcp_fast.mlc_server.server as srv

    base, _ = server
    on_loop: list[tuple[str, bool]] = []
    dumps, decode = srv.cbor.deterministic_cbor, srv.cbor.decode

    def running_loop() -> bool:
        try:
            asyncio.get_running_loop()
            return True
        except RuntimeError:
            return False

    def spy_dumps(obj):
        if isinstance(obj, dict) and "data" in obj:
            on_loop.append(("encode", running_loop()))
        return dumps(obj)

    def spy_decode(data):
        if len(data) > srv.INLINE_BYTES:
            on_loop.append(("decode", running_loop()))
        return decode(data)

    monkeypatch.setattr(srv.cbor, "deterministic_cbor", spy_dumps)
    monkeypatch.setattr(srv.cbor, "decode", spy_decode)
    data = os.urandom(2 << 20)
    body = dumps({"data": data, "meta": {"dtype": "uint8"}})
    assert call(base, "PUT", f"/objects/{name(5)}", body, {"Content-Type": "application/cbor"})[0] == 201
    status, _, got = call(base, "GET", f"/objects/{name(5)}", headers={"Accept": "application/cbor"})
    assert status == 200 and cbor2.loads(got)["data"] == data
    assert on_loop == [("decode", False), ("encode", False)]


def test_the_loop_never_waits_behind_a_store_busy_with_a_large_copy(server):
    base, mlc = server
    mlc.put("mlc://" + name(12), b"small")
    held, release = threading.Event(), threading.Event()

    def long_copy() -> None:  # what a worker thread copying a large object does to the lock
        with mlc._lock:
            held.set()
            release.wait(10)

    holder = threading.Thread(target=long_copy)
    holder.start()
    held.wait(5)
    waiting = [threading.Thread(target=call, args=(base, method, f"/objects/{name(12)}"))
               for method in ("GET", "HEAD")]
    for t in waiting:
        t.start()
    try:
        time.sleep(0.2)  # both requests are in the server now, waiting for the store
        t0 = time.monotonic()
        assert call(base, "GET", "/nothing-here")[0] == 404
        assert time.monotonic() - t0 < 1.5, "another client waited for the store's lock"
    finally:
        release.set()
        holder.join(10)
        for t in waiting:
            t.join(10)


# -- 8. every field's type and range -------------------------------------------------------

def _cbor(doc: object) -> dict[str, str]:
    return {"Content-Type": "application/cbor"}


@pytest.mark.parametrize("bad", [[1], {"a": 1}, -5, 0, 2 ** 64, "10", True, 1.5])
def test_bad_lease_ttls_are_400_on_every_route(server, bad):
    base, mlc = server
    mlc.put("mlc://" + name(6), b"x")
    lease = mlc.lease("mlc://" + name(6), 10)
    put = cbor2.dumps({"data": b"x", "lease_ms": bad})
    assert_problem(call(base, "PUT", f"/objects/{name(7)}", put, _cbor(put)), 400)
    create = cbor2.dumps({"uri": "mlc://" + name(6), "ttl_ms": bad})
    assert_problem(call(base, "POST", "/leases", create, _cbor(create)), 400)
    renew = cbor2.dumps({"ttl_ms": bad})
    assert_problem(call(base, "PUT", f"/leases/{lease}", renew, _cbor(renew)), 400)


@pytest.mark.parametrize("query", ["1" * 400, "-1", "0", "abc", str(2 ** 64)])
def test_bad_lease_ms_queries_are_400(server, query):
    base, _ = server
    assert_problem(call(base, "PUT", f"/objects/{name(8)}?lease_ms={query}", b"x"), 400)


@pytest.mark.parametrize("meta", [5, b"raw", [1, 2], {1: "int key"}, {"big": "x" * (70 << 10)}])
def test_bad_meta_is_400(server, meta):
    base, _ = server
    body = cbor2.dumps({"data": b"x", "meta": meta})
    assert_problem(call(base, "PUT", f"/objects/{name(9)}", body, _cbor(body)), 400)


@pytest.mark.parametrize("path", [
    "/objects/../../../../etc/passwd", "/objects/%2e%2e/%2e%2e/etc/passwd", "/objects/%ff%fe/x/q_rows",
    f"/objects/{SCOPE.hex()}/../q_rows/1", f"/objects/{SCOPE.hex()}/AAAA/not_a_kind",
    f"/objects/{log_name(1)}", f"/logs/{name(1)}", "/logs/x", f"/objects/{SCOPE.hex().upper()}/AAAA/q_rows/1",
])
def test_names_outside_the_documented_form_are_400(server, path):
    base, mlc = server
    for method in ("PUT" if path.startswith("/objects/") else "POST", "GET"):
        assert_problem(call(base, method, path, None if method == "GET" else b"\xa1eepoch\x01"), 400)
    assert mlc.stats()["index"]["objects"] == 0


def test_bad_from_and_range_are_problems(server):
    base, mlc = server
    assert_problem(call(base, "GET", f"/logs/{log_name(1)}?from=" + "9" * 400), 400)
    mlc.put("mlc://" + name(1), b"abc")
    assert_problem(call(base, "GET", f"/objects/{name(1)}", headers={"Range": "bytes=" + "9" * 400 + "-"}), 416)


# -- 9. framing errors the application sees are problems -----------------------------------

def test_wrong_method_and_unknown_route_are_problems(server):
    base, _ = server
    doc = assert_problem(call(base, "PATCH", f"/objects/{name(1)}", b""), 405)
    assert doc["title"] == "Method Not Allowed"
    assert_problem(call(base, "GET", "/nothing"), 404)
    assert_problem(call(base, "POST", f"/logs/{log_name(1)}", b"\xff\x00", {"Content-Type": "application/cbor"}), 400)


def test_concurrent_uploads_share_one_bounded_budget(tmp_path):
    with MLC([HostTier(16 << 20)]) as mlc, serving(mlc, inflight_bytes=4 << 20) as base:
        slow = socket.create_connection(("127.0.0.1", port_of(base)))
        slow.sendall(f"PUT /objects/{name(10)} HTTP/1.1\r\nHost: t\r\nContent-Length: {4 << 20}\r\n\r\n".encode())
        slow.sendall(b"\x03" * (3 << 20))  # holds 3 MiB of the 4 MiB budget while it dawdles
        time.sleep(0.3)
        answer = call(base, "PUT", f"/objects/{name(11)}", b"\x04" * (2 << 20))
        doc = assert_problem(answer, 503)
        assert doc["limit"] == 4 << 20
        slow.sendall(b"\x03" * (1 << 20))
        slow.settimeout(10)
        assert slow.recv(4096).startswith(b"HTTP/1.1 201")
        slow.close()
        assert call(base, "PUT", f"/objects/{name(11)}", b"\x04" * (2 << 20))[0] == 201, "the budget came back"


def test_a_stalled_upload_is_answered_408_and_gives_its_budget_back(tmp_path):
    with MLC([HostTier(16 << 20)]) as mlc, serving(mlc, inflight_bytes=4 << 20, request_timeout=1.0) as base:
        stalled = []
        for n in range(2):  # each sends 1.5 MiB of a 64 MiB body, then idles
            s = socket.create_connection(("127.0.0.1", port_of(base)))
            s.sendall(f"PUT /objects/{name(20 + n)} HTTP/1.1\r\nHost: t\r\nContent-Length: {64 << 20}\r\n\r\n".encode())
            s.sendall(b"\x05" * (3 << 19))
            stalled.append(s)
        time.sleep(0.3)
        assert_problem(call(base, "PUT", f"/objects/{name(22)}", b"\x06" * (2 << 20)), 503)
        for s in stalled:
            s.settimeout(10)
            head = s.recv(4096)
            assert head.startswith(b"HTTP/1.1 408"), head[:200]
            assert b"mlc-body-timeout" in head or b"mlc-body-timeout" in s.recv(4096)
            s.close()
        assert call(base, "PUT", f"/objects/{name(22)}", b"\x06" * (2 << 20))[0] == 201, "the budget came back"
        assert not any(mlc.contains("mlc://" + name(20 + n)) for n in range(2))
