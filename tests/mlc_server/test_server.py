"""The MLC and its commit logs over HTTP, plain and with mutual TLS."""

from __future__ import annotations

import ssl

import pytest

from sdcp_fast.cache import MLC, BadRange, ObjectLeased, ObjectUnavailable, UnknownLease, object_uri
from sdcp_fast.cache.tiers.disk import DiskTier
from sdcp_fast.cache.tiers.host import HostTier
from sdcp_fast.commitlog import Fenced, PreconditionFailed, open_commit_log
from sdcp_fast.commitlog.directory import LogDirectory
from sdcp_fast.commitlog.http import HttpCommitLog
from sdcp_fast.protocol.commitlog import CommitRecord, FenceRecord
from sdcp_fast.transport.tls import client_context, server_context
from tests.store.certkit import make_certs

from .serverkit import ALPN, WIRES, serving

SCOPE = bytes(range(16))


def uri(n: int, kind: str = "q_rows") -> str:
    return object_uri(SCOPE, b"s" * 16, kind, n)


@pytest.fixture
def mlc(tmp_path, clock):
    m = MLC([HostTier(1 << 20), DiskTier(4 << 20, str(tmp_path))], clock=clock)
    yield m
    m.close()


@pytest.fixture
def logs(tmp_path):
    d = LogDirectory(str(tmp_path))
    yield d
    d.close()


@pytest.fixture(params=WIRES)
def served(request, mlc, logs):
    with serving(mlc, logs=logs, http2=request.param == "h2") as base:
        yield base


@pytest.fixture
def remote(served):
    with served.client() as client:
        yield client


def test_put_get_head_delete(remote, mlc):
    data = bytes(range(256)) * 40
    stored = remote.put(uri(1), data)
    assert bytes(remote.get(uri(1))) == data
    assert bytes(mlc.get(uri(1))) == data, "the remote put landed in the served MLC"
    head = remote.head(uri(1))
    assert (head.size, head.etag, head.tier, head.leased) == (len(data), stored.etag, "host", False)
    remote.delete(uri(1))
    with pytest.raises(ObjectUnavailable):
        remote.get(uri(1))
    assert not remote.contains(uri(1))


def test_byte_ranges(remote):
    data = bytes(range(256)) * 16
    remote.put(uri(1), data)
    assert bytes(remote.get_range(uri(1), 5, 300)) == data[5:300]
    assert bytes(remote.get_range(uri(1), 4000)) == data[4000:]
    out = bytearray(5000)
    assert remote.get_into(uri(1), out) == len(data) and bytes(out[: len(data)]) == data
    with pytest.raises(BadRange):
        remote.get_range(uri(1), 5000, 6000)


def test_leases_over_http(remote, clock):
    stored = remote.put(uri(1), b"q", lease_ttl=5)
    assert stored.lease and remote.head(uri(1)).leased
    with pytest.raises(ObjectLeased):
        remote.delete(uri(1))
    extra = remote.lease(uri(1), 10)
    remote.renew(stored.lease, 20)
    remote.release(extra)
    clock.advance(21)
    with pytest.raises(ObjectUnavailable):
        remote.get(uri(1))
    with pytest.raises(UnknownLease):
        remote.release(stored.lease)


def test_lease_release_with_drop_over_http(remote):
    stored = remote.put(uri(1), b"q", lease_ttl=5)
    remote.release(stored.lease, drop=True)
    assert not remote.contains(uri(1))
    kept = remote.put(uri(2), b"q", lease_ttl=5)
    remote.release(kept.lease)  # without drop the object stays, unpinned
    assert remote.contains(uri(2)) and not remote.head(uri(2)).leased


def test_tensor_meta_and_prefetch(remote):
    remote.put(uri(1), b"\x00" * 8, meta={"dtype": "float32", "shape": [2]})
    assert remote.prefetch([uri(1), uri(2)]).result(timeout=10) == [True, False]
    assert bytes(remote.get(uri(1))) == b"\x00" * 8


def test_tensor_round_trip_keeps_dtype_and_shape(remote, mlc):
    torch = pytest.importorskip("torch")
    rows = torch.rand(3, 7)
    remote.put(uri(1), rows)
    back = remote.get_tensor(uri(1))
    assert back.dtype == torch.float32 and back.shape == (3, 7) and torch.equal(back, rows)
    assert torch.equal(mlc.get_tensor(uri(1)), rows), "the served MLC kept the metadata too"


def test_stats(remote):
    remote.put(uri(1), b"abc")
    remote.get(uri(1))
    stats = remote.stats()
    assert stats["scopes"][SCOPE.hex()]["host"]["hits"] == 1
    assert stats["tiers"][0]["name"] == "host"


def test_prometheus_metrics(remote, served):
    remote.put(uri(1), b"abcd")
    remote.get(uri(1))
    resp = served.fetch("GET", "/metrics")
    assert resp.status == 200 and resp.content_type.startswith("text/plain")
    text = resp.body.decode()
    assert f'sdcp_mlc_bytes{{scope="{SCOPE.hex()}",tier="host"}} 4' in text
    assert f'sdcp_mlc_hits_total{{scope="{SCOPE.hex()}",tier="host"}} 1' in text
    assert 'sdcp_mlc_tier_used_bytes{tier="host"} 4' in text and "# TYPE sdcp_mlc_leases gauge" in text


def test_unknown_route_is_a_problem_document(served):
    import json

    resp = served.fetch("GET", "/nothing-here")
    assert resp.status == 404
    assert resp.content_type.startswith("application/problem+json")
    assert json.loads(resp.body)["status"] == 404
    resp = served.fetch("PATCH", f"/objects/{uri(1).removeprefix('mlc://')}")
    assert resp.status == 405 and json.loads(resp.body)["title"] == "Method Not Allowed"


def test_problem_for_bad_name(remote):
    with pytest.raises(ValueError):
        remote.put("mlc://not a uri", b"x")


def test_commit_log_over_http_with_if_match(served, logs):
    log_uri = uri(0, "commit_log").rsplit("/", 1)[0]
    ref = f"{served}/logs/{log_uri.removeprefix('mlc://')}"
    a = HttpCommitLog(ref, http1=True) if served.http1 else open_commit_log(ref)
    b = served.log(log_uri)
    view = a.read()
    assert view.etag == '"0"' and view.records == []
    rec = CommitRecord(1, 1, (5, 6), 2, b"\x01" * 32)
    assert a.append(rec, view.etag) == '"1"'
    with pytest.raises(PreconditionFailed) as exc:
        b.append(rec, view.etag)
    assert exc.value.status == 412
    b.append(FenceRecord(2), None)
    with pytest.raises(Fenced):
        a.append(rec, a.read().etag)
    assert b.read(1).records == [FenceRecord(2)]
    assert logs.log(log_uri).read().records == [rec, FenceRecord(2)], "same log in-process"


@pytest.mark.parametrize("wire", WIRES)
def test_mutual_tls(mlc, tmp_path, wire):
    certs = make_certs(tmp_path)
    ctx = server_context(certs["server_cert"], certs["server_key"], certs["ca"], alpn=(ALPN[wire],))
    with serving(mlc, ctx, http2=wire == "h2") as base:
        good = client_context(certs["client_cert"], certs["client_key"], certs["ca"])
        with base.client(ssl=good) as client:
            client.put(uri(1), b"secret")
            assert bytes(client.get(uri(1))) == b"secret"
        with base.client(ssl=ssl.create_default_context(cafile=certs["ca"])) as anonymous:  # no certificate
            with pytest.raises((ssl.SSLError, ConnectionError)):
                anonymous.get(uri(1))
