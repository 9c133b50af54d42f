"""The MLC's group commits (``POST /logs``) on their commit thread: requests queued during a
flush share the next one and are each answered on their own, and the native server's direct
path answers them as the general path does."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

import sdcp_fast.commitlog.file as file_log
from sdcp_fast.cache.index import MLC
from sdcp_fast.cache.tiers.host import HostTier
from sdcp_fast.commitlog.backend import etag_of
from sdcp_fast.commitlog.directory import LogDirectory
from sdcp_fast.mlc_server.server import MLCService
from sdcp_fast.protocol import cbor
from sdcp_fast.protocol.commitlog import CommitRecord, encode_record
from sdcp_fast.protocol.peer import Peer, PeerRole
from sdcp_fast.transport.base import Request, Response

from .test_server_pressure import VERIFIER, log_name

DRAFTER = Peer("https://127.0.0.1:8511/", PeerRole.DRAFTER)
CBOR = {"content-type": "application/cbor"}


@pytest.fixture
def service(tmp_path):
    logs = LogDirectory(str(tmp_path / "logs"), sync=False)
    with MLC([HostTier(8 << 20)]) as mlc:
        service = MLCService(mlc, logs)
        yield service
        service.close()
    logs.close()


def group(*logs: int, round_: int = 0) -> bytes:
    return cbor.deterministic_cbor({"appends": [
        {"log": log_name(n), "record": encode_record(CommitRecord(1, round_, (n,), round_ + 1, bytes(32)))}
        for n in logs]})


def results(answer: Response) -> list[Any]:
    assert answer.status == 200, answer.body
    return [(r["status"], r.get("etag")) for r in cbor.decode(answer.body)["results"]]


async def until(condition: Any, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.005)


def test_group_appends_queued_during_a_flush_share_the_next_flush(service, monkeypatch):
    flushed: list[int] = []  # logs per flush
    entered, go = threading.Event(), threading.Event()
    flush = file_log._flush

    def held_flush(logs: list[Any]) -> Any:
        flushed.append(len(logs))
        if len(flushed) == 1:
            entered.set()
            assert go.wait(30), "the first flush was never let go"
        return flush(logs)

    monkeypatch.setattr(file_log, "_flush", held_flush)

    async def run() -> list[Response]:
        def post(body: bytes) -> asyncio.Task[Response]:
            return asyncio.ensure_future(service.handler(Request("POST", "logs", body=body, peer=VERIFIER,
                                                                 headers=CBOR)))

        first = post(group(1, 2))
        await until(entered.is_set, "the first group commit never reached its flush")
        later = [post(group(3)), post(group(2, round_=1)), post(b"\xff")]  # the last is no CBOR
        for _ in range(5):
            await asyncio.sleep(0)  # each request is queued before its coroutine first waits
        go.set()
        return [await first, *[await t for t in later]]

    first, third, second_again, bad = asyncio.run(run())
    assert results(first) == [(201, etag_of(1)), (201, etag_of(1))]
    assert results(third) == [(201, etag_of(1))]
    assert results(second_again) == [(201, etag_of(2))], "an entry queued later sees the earlier flush's record"
    assert bad.status == 400, "a body that is no group append is refused as a whole, alone"
    assert flushed == [2, 2], "the requests queued during the first flush are flushed together"


def test_the_direct_route_answers_as_the_general_one(service):
    async def run() -> None:
        assert service.answer_now("GET", "logs", {}, b"", {}, VERIFIER) is None
        assert service.answer_now("POST", f"logs/{log_name(1)}", {}, b"", {}, VERIFIER) is None
        refused = service.answer_now("POST", "logs", {}, group(1), CBOR, DRAFTER)
        assert isinstance(refused, Response) and refused.status == 403, "refused before anything is queued"
        too_big = service.answer_now("POST", "logs", {}, b"", {"content-length": str(1 << 40)}, VERIFIER)
        assert isinstance(too_big, Response) and too_big.status == 413
        for body, status in ((group(1, 2), 200), (b"\xa0", 400)):
            future = service.answer_now("POST", "logs", {}, body, CBOR, VERIFIER)
            assert isinstance(future, asyncio.Future)
            await asyncio.wait([future])
            direct = service.settled(future)
            assert direct.status == status
            general = await service.handler(Request("POST", "logs", body=group(3, 4) if status == 200 else body,
                                                     peer=VERIFIER, headers=CBOR))
            assert (general.status, general.headers.get("content-type")) == (status, direct.headers.get("content-type"))
        future = service.answer_now("POST", "logs", {}, group(1, round_=1), CBOR, VERIFIER)
        assert isinstance(future, asyncio.Future)
        await asyncio.wait([future])
        assert results(service.settled(future)) == [(201, etag_of(2))], "the direct append's record was committed"

    asyncio.run(run())


def test_a_read_of_a_missing_log_is_answered_at_once_as_the_general_route_answers(service):
    async def run() -> None:
        async def both(path: str, query: dict[str, str], peer: Peer) -> tuple[Response | None, Response]:
            direct = service.answer_now("GET", path, query, b"", {}, peer)
            assert not isinstance(direct, asyncio.Future)
            return direct, await service.handler(Request("GET", path, query=query, peer=peer))

        for path, query, peer, status in ((f"logs/{log_name(5)}", {"from": "0"}, VERIFIER, 404),
                                          ("logs/not-a-log", {}, VERIFIER, 400),
                                          (f"logs/{log_name(5)}", {"from": "x"}, VERIFIER, 400),
                                          (f"logs/{log_name(5)}", {}, Peer("https://127.0.0.1:1/", PeerRole.CLIENT), 403)):
            direct, general = await both(path, query, peer)
            assert direct is not None and (direct.status, direct.body) == (general.status, general.body) == (
                status, general.body), (path, query)
        assert service.answer_now("GET", "logs/", {}, b"", {}, VERIFIER) is None, "no route: the general 404"
        await service.handler(Request("POST", "logs", body=group(5), peer=VERIFIER, headers=CBOR))
        direct, general = await both(f"logs/{log_name(5)}", {"from": "0"}, VERIFIER)
        assert direct is None and general.status == 200, "a log to read is read by the general route"

    asyncio.run(run())
