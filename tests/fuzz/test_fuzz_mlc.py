"""Fuzzing the MLC server's routes (objects, leases, commit logs) through its handler, in
process, with the identities of peers that own nothing there.

A q-rows object written by drafter A and a commit log with records sit in the store
throughout; log appends go to the single-record route and, reshaped, to the batch route. Every answer: no 5xx but the documented ones (503 sdcp-busy, 507 mlc-full), no
traceback, Problem Details on every refusal; the object's bytes never change (nobody sending
owns it), and the log changes only by appends answered 201.
"""

from __future__ import annotations

import asyncio
import json
import random
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from sdcp_fast.cache import object_uri
from sdcp_fast.cache.index import MLC
from sdcp_fast.cache.tiers.host import HostTier
from sdcp_fast.commitlog.directory import LogDirectory
from sdcp_fast.mlc_server.server import MLCService
from sdcp_fast.protocol import cbor
from sdcp_fast.protocol.commitlog import CommitRecord, FenceRecord, encode_record
from sdcp_fast.protocol.peer import Peer, PeerRole
from sdcp_fast.transport.base import Request

from .fuzzkit import EXAMPLES, ODD_VALUES, PER_EXAMPLE, TRACEBACK_MARKS, encode_any, mutate, reshape

# Six route groups share each example's bodies: six times the examples, INPUTS per group.
SETTINGS = settings(max_examples=6 * EXAMPLES, derandomize=True, database=None, deadline=None,
                    suppress_health_check=list(HealthCheck), phases=[Phase.explicit, Phase.generate])
SCOPE = bytes(range(16))
SESSION = b"fuzz-mlc-session"
OWNER = Peer("https://127.0.0.1:8511/", PeerRole.DRAFTER)
STRANGERS = [Peer("https://127.0.0.1:8512/", PeerRole.DRAFTER), Peer("https://127.0.0.1:8501/", PeerRole.VERIFIER),
             Peer(None, PeerRole.CLIENT), Peer("https://x/", None), Peer("https://127.0.0.1:8470/", PeerRole.MLC)]
Q = object_uri(SCOPE, SESSION, "q_rows", 1)
LOG = object_uri(SCOPE, SESSION, "commit_log")
SERVER_ERRORS = {503: "sdcp-busy", 507: "mlc-full"}


def bare(uri: str) -> str:
    """A name as its route spells it: without the scheme."""
    return uri.removeprefix("mlc://")


class MlcRig:
    def __init__(self, root: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.mlc = MLC([HostTier(64 << 20)])
        self.logs = LogDirectory(root, sync=False)
        self.service = MLCService(self.mlc, self.logs)
        self.q = bytes(range(256)) * 4
        self.send(Request("PUT", f"objects/{bare(Q)}", body=self.q, peer=OWNER))
        for record in (CommitRecord(epoch=1, round=1, emitted=(1, 2), committed=2, digest=b"\x01" * 32),
                       FenceRecord(epoch=2)):
            self.send(Request("POST", f"logs/{bare(LOG)}", body=encode_record(record),
                              peer=Peer("https://127.0.0.1:8500/", PeerRole.ROUTER)))

    def send(self, request: Request) -> Any:
        return self.loop.run_until_complete(asyncio.wait_for(self.service.handler(request), 30))

    def state(self) -> tuple[bytes, int]:
        return bytes(self.mlc.get(Q)), len(self.logs.log(LOG).read(0).records)

    def close(self) -> None:
        self.logs.close()
        self.mlc.close()
        self.loop.close()


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Any:
    r = MlcRig(str(tmp_path_factory.mktemp("fuzz-mlc")))
    yield r
    r.close()


def check(response: Any, request: Request) -> None:
    if response.status >= 500:
        assert SERVER_ERRORS.get(response.status) and SERVER_ERRORS[response.status] in response.body.decode(
            "latin-1"), (response.status, response.body[:300], request)
    for mark in TRACEBACK_MARKS:
        assert mark not in response.body, (response.body[:300], request)
    if response.status >= 400 and request.method != "HEAD":
        assert response.content_type.startswith("application/problem+json"), (response, request)
        body = json.loads(response.body)
        assert body["status"] == response.status and body["title"], body


def batch_appended(request: Request, response: Any) -> int:
    """Records a batch append answered 200 added to LOG: its entries on LOG answered 201 (each
    answer a status a refused entry may get, never a 5xx)."""
    entries = cbor.decode(request.body)["appends"]
    results = cbor.decode(response.body)["results"]
    assert len(results) == len(entries), (results, request)
    assert all(r["status"] in (201, 400, 403, 409, 412, 413) for r in results), (results, request)
    return sum(1 for e, r in zip(entries, results, strict=True) if r["status"] == 201 and e["log"] == bare(LOG))


_NAMES = st.sampled_from([Q, LOG, object_uri(SCOPE, SESSION, "target_kv"), object_uri(SCOPE, b"other-session-01", "q_rows", 2)])


def requests_for(name: str, ttl: Any, rng: random.Random, q: bytes, n: int) -> list[Request]:
    """``n`` requests over every route group, from peers that own nothing (the peer is set
    here for in-process calls; over the wire the certificate decides)."""
    lease_map = {"uri": name, "ttl_ms": ttl}
    record = encode_record(CommitRecord(epoch=rng.randint(0, 3), round=rng.randint(0, 3), emitted=(5,),
                                        committed=rng.randint(0, 4), digest=bytes(32)))
    out = []
    for i in range(n):
        peer = rng.choice(STRANGERS)
        kind = i % 6
        target = bare(name) if rng.random() < 0.6 else mutate(bare(name).encode(), rng).decode("latin-1")
        query: dict[str, str] = {}
        headers: dict[str, str] = {}
        if kind == 0:
            method, path = "PUT", f"objects/{target}"
            body = mutate(q, rng) if rng.random() < 0.5 else \
                encode_any(reshape({"data": b"x" * 8, "lease_ms": 1000, "meta": {"a": 1}}, rng))
            headers["content-type"] = rng.choice(["application/cbor", "application/octet-stream"])
            query = {"lease_ms": rng.choice(["1", "0", "99999999999", "-1", "x", ""])} if rng.random() < 0.3 else {}
        elif kind == 1:
            method, path, body = rng.choice(["GET", "HEAD", "DELETE"]), f"objects/{target}", b""
            if rng.random() < 0.3:
                headers["range"] = rng.choice(["bytes=0-3", "bytes=9-1", "bytes=-5", "bytes=" + "9" * 30, "x"])
        elif kind == 2:
            method, path = "POST", "leases"
            try:
                body = encode_any(reshape(lease_map, rng)) if rng.random() < 0.5 else mutate(encode_any(lease_map), rng)
            except (ValueError, TypeError):
                body = mutate(cbor.deterministic_cbor({"uri": name, "ttl_ms": 5}), rng)
        elif kind == 3:
            method, path, body = rng.choice(["PUT", "DELETE"]), f"leases/{rng.choice(['0' * 32, 'x', '..', 'f' * 300])}", \
                cbor.deterministic_cbor({"ttl_ms": 5})
        elif kind == 4 and rng.random() < 0.3:  # the batch append: entries reshaped, or its bytes mutated
            entries = [{"log": target, "record": mutate(record, rng) if rng.random() < 0.3 else record,
                        "if_match": rng.choice(['"0"', '"2"', "*", "x" * 100, ""])}, {"log": bare(LOG), "record": record}]
            batch = {"appends": [reshape(e, rng) if rng.random() < 0.5 else e for e in entries]}
            method, path = "POST", "logs"
            body = encode_any(batch) if rng.random() < 0.7 else mutate(encode_any(batch), rng)
            headers["content-type"] = "application/cbor"
        elif kind == 4:
            method, path, body = "POST", f"logs/{target}", mutate(record, rng) if rng.random() < 0.7 else record
            if rng.random() < 0.5:
                headers["if-match"] = rng.choice(['"0"', "*", "x" * 100, ""])
        else:
            method, path, body = rng.choice(["GET", "PATCH", "OPTIONS"]), rng.choice(
                [f"logs/{target}", "stats", "metrics", "objects/", "../../etc/passwd", ""]), b""
            if rng.random() < 0.5:
                query = {"from": rng.choice(["0", "1", "9" * 40, "-1", "a"])}
        out.append(Request(method, path, query=query, body=body, headers=headers, peer=peer))
    return out


@SETTINGS
@given(name=_NAMES, ttl=st.one_of(st.integers(-5, 2**65), st.sampled_from(ODD_VALUES)), seed=st.integers(0, 2**32 - 1))
def test_mlc_routes(rig: MlcRig, name: str, ttl: Any, seed: int) -> None:
    rng = random.Random(seed)
    before_q, before_log = rig.state()
    appended = 0
    for request in requests_for(name, ttl, rng, rig.q, PER_EXAMPLE):
        response = rig.send(request)
        check(response, request)
        if request.method == "POST" and request.path == f"logs/{bare(LOG)}" and response.status == 201:
            appended += 1
        if request.method == "POST" and request.path == "logs" and response.status == 200:
            appended += batch_appended(request, response)
    q, log = rig.state()
    assert q == before_q, "an object changed under a peer that does not own it"
    assert log == before_log + appended


def test_mlc_over_http2_and_mtls(tmp_path) -> None:
    """A smaller run over the MLC's real carrier (``SDCP_FUZZ_H2`` inputs, 600 by default) with a
    drafter certificate that owns nothing there."""
    import os

    from sdcp_fast.cache.index import MLC as Store
    from sdcp_fast.mlc_server.server import serve as serve_mlc
    from sdcp_fast.transport.certs import InstanceSpec, instance_files, write_certificates
    from sdcp_fast.transport.h2client import H2Transport
    from sdcp_fast.transport.tls import client_context, server_context

    n = int(os.environ.get("SDCP_FUZZ_H2", "600"))
    write_certificates(tmp_path, [InstanceSpec("mlc", PeerRole.MLC, "https://127.0.0.1:8470/"),
                                  InstanceSpec("owner", PeerRole.DRAFTER, OWNER.uri),
                                  InstanceSpec("stranger", PeerRole.DRAFTER, "https://127.0.0.1:8512/")])

    async def scenario() -> tuple[bytes, bytes, int]:
        store = Store([HostTier(64 << 20)])
        logs = LogDirectory(str(tmp_path / "logs"), sync=False)
        server = await serve_mlc(MLCService(store, logs), "127.0.0.1", 0,
                                 ssl=server_context(*instance_files(tmp_path, "mlc")))
        url = f"https://127.0.0.1:{server.port}"
        owner = H2Transport(client_context(*instance_files(tmp_path, "owner")), timeout=20)
        stranger = H2Transport(client_context(*instance_files(tmp_path, "stranger")), timeout=20)
        try:
            q = bytes(range(256)) * 4
            put = await owner.request(url, "PUT", f"objects/{bare(Q)}", body=q)
            assert put.status < 300, put
            rng = random.Random(7)
            sent = 0
            for request in requests_for(Q, 1000, rng, q, n):
                response = await stranger.request(url, request.method, request.path, body=request.body,
                                                  query=request.query, headers=dict(request.headers))
                check(response, request)
                sent += 1
            got = await owner.request(url, "GET", f"objects/{bare(Q)}")
            return got.body, q, sent
        finally:
            await owner.close()
            await stranger.close()
            server.close()
            await server.wait_closed()
            logs.close()
            store.close()

    body, q, sent = asyncio.run(asyncio.wait_for(scenario(), 300))
    assert body == q and sent == n
