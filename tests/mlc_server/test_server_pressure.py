"""The MLC server's routes under pressure, in process: work that grows with a request's size
stays off the event loop, and what a request leaves behind is freed."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import sdcp_fast.mlc_server.server as srv
from sdcp_fast.cache import object_uri
from sdcp_fast.cache.index import MLC
from sdcp_fast.cache.tiers.host import HostTier
from sdcp_fast.commitlog.directory import LogDirectory
from sdcp_fast.mlc_server.server import MLCService
from sdcp_fast.protocol.commitlog import CommitRecord, encode_record
from sdcp_fast.protocol.peer import Peer, PeerRole
from sdcp_fast.transport.base import Request

VERIFIER = Peer("https://127.0.0.1:8501/", PeerRole.VERIFIER)


def log_name(n: int) -> str:
    return object_uri(bytes(16), n.to_bytes(16, "big"), "commit_log").removeprefix("mlc://")


@pytest.fixture
def service(tmp_path):
    logs = LogDirectory(str(tmp_path / "logs"), sync=False)
    with MLC([HostTier(8 << 20)]) as mlc:
        yield MLCService(mlc, logs)
    logs.close()


def _on_loop() -> bool:
    try:
        asyncio.get_running_loop()
        return True
    except RuntimeError:
        return False


def test_a_log_append_decodes_its_record_off_the_loop_valid_or_not(service, monkeypatch):
    seen: list[bool] = []
    decode = srv.decode_stored_record

    def spy(data: bytes, **bounds: Any) -> Any:
        seen.append(_on_loop())
        return decode(data, **bounds)

    monkeypatch.setattr(srv, "decode_stored_record", spy)
    good = encode_record(CommitRecord(1, 0, tuple(range(5000)), 0, bytes(32)))
    bad = good.replace(b"fdigestX ", b"fdigestX\x1f")  # a 31-byte digest
    assert bad != good

    async def run() -> list[int]:
        answers = []
        for body in (good, bad):
            answer = await service.handler(Request("POST", f"logs/{log_name(1)}", body=body, peer=VERIFIER,
                                                   headers={"content-type": "application/cbor"}))
            answers.append(answer.status)
        return answers

    assert asyncio.run(run()) == [201, 400]
    assert seen == [False, False], "the record was decoded on the event loop"


def test_metadata_is_charged_the_memory_it_holds(service):
    import tracemalloc

    from sdcp_fast.protocol import cbor

    drafter = Peer("https://127.0.0.1:8511/", PeerRole.DRAFTER)
    body = cbor.deterministic_cbor({"data": b"x", "meta": {"k": [[]] * 20000}})  # 20 KB of CBOR
    name = object_uri(bytes(16), b"s" * 16, "q_rows", 1).removeprefix("mlc://")
    charged = service.mlc.stats()["index"]["bytes"]
    tracemalloc.start()
    try:
        answer = asyncio.run(service.handler(Request("PUT", f"objects/{name}", body=body, peer=drafter,
                                                     headers={"content-type": "application/cbor"})))
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert answer.status == 201, answer.body
    charged = service.mlc.stats()["index"]["bytes"] - charged
    assert held > 1 << 20, "the decoded metadata is what the object holds"
    assert charged >= 0.8 * held, f"{held} bytes held, {charged} charged"
