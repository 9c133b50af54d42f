"""Store.append_batch (group commit) the same in both implementations: each entry checked and
answered on its own, the store's own logs together (one request to a server), logs of other
backends beside them; and the server's POST /logs under hostile input: a problem document with
a 4xx, never a 500."""

from __future__ import annotations

import asyncio

import pytest

from sdcp_fast.cache import MLC, object_uri
from sdcp_fast.cache.tiers.host import HostTier
from sdcp_fast.commitlog.directory import LogDirectory
from sdcp_fast.commitlog.http import MAX_BATCH, MAX_BATCH_BODY
from sdcp_fast.protocol import cbor
from sdcp_fast.protocol.commitlog import CommitRecord, FenceRecord, encode_record
from sdcp_fast.protocol.problems import PROBLEM_MEDIA_TYPE
from sdcp_fast.store import RemoteStore, Store
from sdcp_fast.store.interface import LogAppend
from tests.mlc_server.serverkit import WIRES, serving

from .test_interface import opened, run  # noqa: F401 - the store fixture (local and remote)

SCOPE = bytes(range(16))


def log_name(n: int) -> str:
    return object_uri(SCOPE, bytes([n]) * 16, "commit_log")


def commit(epoch: int, round_: int) -> CommitRecord:
    return CommitRecord(epoch=epoch, round=round_, emitted=(round_,), committed=round_, digest=bytes(32))


def _kinds(results) -> list[str]:
    return [r if isinstance(r, str) else type(r).__name__ for r in results]


def test_each_entry_is_answered_on_its_own_in_both_stores(opened, tmp_path):  # noqa: F811
    """A fence, a stale tag, successes and a log of another backend in one batch: the same
    answers from the store in this process and from the server's."""
    elsewhere = "file://" + str(tmp_path / "elsewhere.log")

    async def scenario(store: Store):
        fenced, moved, fresh, fence_me = [await store.commit_log(log_name(n)) for n in range(4)]
        other = await store.commit_log(elsewhere)
        await fenced.append(FenceRecord(2), None)
        await moved.append(commit(1, 1), '"0"')
        results = await store.append_batch([
            LogAppend(fenced, commit(1, 1), '"1"'),
            LogAppend(moved, commit(1, 1), '"0"'),
            LogAppend(fresh, commit(1, 1), '"0"'),
            LogAppend(other, commit(1, 1), '"0"'),
            LogAppend(fence_me, FenceRecord(3), None),
            LogAppend(fresh, commit(1, 2), '"1"'),
        ])
        logs = [fenced, moved, fresh, fence_me, other]
        return _kinds(results), [(await log.read()).records for log in logs], results[0]

    kinds, records, fenced_answer = run(opened, scenario)
    assert kinds == ["Fenced", "PreconditionFailed", '"1"', '"1"', '"1"', '"2"']
    assert fenced_answer.status == 409 and fenced_answer.suffix == "sdcp-stale-epoch"
    assert records == [[FenceRecord(2)], [commit(1, 1)], [commit(1, 1), commit(1, 2)], [FenceRecord(3)],
                       [commit(1, 1)]]


def test_an_empty_batch_is_answered_empty(opened):  # noqa: F811
    async def scenario(store: Store):
        return await store.append_batch([])

    assert run(opened, scenario) == []


def test_a_remote_stores_own_logs_go_in_one_request(tmp_path):
    """The server's logs of one batch travel as one POST /logs, however many."""
    logs = LogDirectory(str(tmp_path))
    with MLC([HostTier(1 << 16)]) as mlc, serving(mlc, logs=logs, http2=True) as base:
        async def scenario():
            store = RemoteStore(base)
            sent: list[tuple[str, str]] = []
            real = store.transport.request

            async def request(base_url, method, path, **kw):
                sent.append((method, path))
                return await real(base_url, method, path, **kw)

            store.transport.request = request  # type: ignore[method-assign]
            try:
                handles = [await store.commit_log(log_name(n)) for n in range(20)]
                results = await store.append_batch([LogAppend(h, commit(1, 1), '"0"') for h in handles])
                return results, sent
            finally:
                await store.aclose()

        results, sent = asyncio.run(scenario())
    assert results == ['"1"'] * 20 and sent == [("POST", "logs")]
    assert all(logs.log(log_name(n)).read().records == [commit(1, 1)] for n in range(20))
    logs.close()


# -- POST /logs under hostile input ---------------------------------------------------------------


@pytest.fixture(params=WIRES)
def served(request, tmp_path):
    logs = LogDirectory(str(tmp_path), sync=False)
    with MLC([HostTier(1 << 16)]) as mlc, serving(mlc, logs=logs, http2=request.param == "h2") as base:
        yield base, logs
    logs.close()


def _post(base, body: bytes):
    return base.fetch("POST", "/logs", body, {"content-type": "application/cbor"})


def _problem(response, status: int, suffix: str) -> None:
    import json

    assert response.status == status, response.body[:300]
    assert response.headers.get("content-type", "").startswith(PROBLEM_MEDIA_TYPE)
    assert json.loads(response.body)["type"].endswith(suffix)


def _entry(name: str, record: bytes, if_match=None) -> dict:
    out = {"log": name.removeprefix("mlc://"), "record": record}
    if if_match is not None:
        out["if_match"] = if_match
    return out


@pytest.mark.parametrize("body", [
    b"\xff\x00garbage",  # not CBOR
    cbor.deterministic_cbor([1, 2]),  # not a map
    cbor.deterministic_cbor({"appends": 5}),
    cbor.deterministic_cbor({"entries": []}),
    cbor.deterministic_cbor({"appends": [5]}),
    cbor.deterministic_cbor({"appends": [{"log": 7, "record": b"x"}]}),
    cbor.deterministic_cbor({"appends": [{"log": "a/b/commit_log", "record": "text"}]}),
    cbor.deterministic_cbor({"appends": [{"log": "a/b/commit_log", "record": b"x", "if_match": 1}]}),
    b"",
])
def test_a_body_not_of_the_batch_shape_is_400(served, body):
    base, logs = served
    _problem(_post(base, body), 400, "sdcp-bad-request")


def test_too_many_entries_or_bytes_are_413_and_nothing_is_appended(served):
    base, logs = served
    name = log_name(1)
    entries = [_entry(name, encode_record(commit(1, 1)))] * (MAX_BATCH + 1)
    _problem(_post(base, cbor.deterministic_cbor({"appends": entries})), 413, "mlc-too-many-appends")
    _problem(_post(base, bytes(MAX_BATCH_BODY + 1)), 413, "mlc-too-large")
    assert not logs.exists(name)


def test_bad_entries_fail_alone(served):
    """An entry whose record is not a record, whose log is not a log's name, or whose tag is
    stale gets its own problem; the good entries beside it are appended."""
    base, logs = served
    good, other = log_name(1), log_name(2)
    body = cbor.deterministic_cbor({"appends": [
        _entry(good, b"\xff\xfe not a record", '"0"'),
        _entry(object_uri(SCOPE, b"s" * 16, "q_rows", 1), encode_record(commit(1, 1)), '"0"'),
        _entry("not/a/name", encode_record(commit(1, 1))),
        _entry(good, encode_record(commit(1, 1)), '"0"'),
        _entry(other, encode_record(commit(1, 1)), '"9"'),
        _entry(other, encode_record(commit(1, 1)), 'W/"0"'),
    ]})
    response = _post(base, body)
    assert response.status == 200
    results = cbor.decode(response.body)["results"]
    assert [r["status"] for r in results] == [400, 400, 400, 201, 412, 412]
    assert results[3]["etag"] == '"1"'
    assert all(r["type"].endswith(("sdcp-bad-request", "mlc-precondition-failed")) for r in results if r["status"] != 201)
    assert logs.log(good).read().records == [commit(1, 1)]
    assert not logs.exists(other), "a stale tag on a log never written creates nothing"


def test_the_single_record_route_stays(served):
    base, logs = served
    name = log_name(3)
    response = base.fetch("POST", "/logs/" + name.removeprefix("mlc://"), encode_record(FenceRecord(1)),
                          {"content-type": "application/cbor", "if-match": '"0"'})
    assert response.status == 201 and response.headers["etag"] == '"1"'
    assert logs.log(name).read().records == [FenceRecord(1)]
