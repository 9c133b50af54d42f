"""What a request to the MLC server may hold and what a failure becomes
(sdcp_fast/mlc_server/server_requests.py)."""

from __future__ import annotations

import asyncio
import json

import pytest

from sdcp_fast.mlc_server.server_requests import BodyTooLarge, Call, UploadBudget, answer_for, release_body
from sdcp_fast.protocol.problems import Busy


def call(body: bytes, **headers: str) -> Call:
    return Call("PUT", "objects/x", {}, headers, None, body)


def test_a_body_over_its_limit_is_refused_by_size_or_by_declared_length():
    with pytest.raises(BodyTooLarge):
        asyncio.run(call(b"x" * 11).body(10))
    with pytest.raises(BodyTooLarge):
        asyncio.run(call(b"", **{"content-length": "11"}).body(10))
    assert asyncio.run(call(b"x" * 10).body(10)) == b"x" * 10


def test_the_upload_budget_bounds_the_bytes_held_at_once():
    budget = UploadBudget(10)
    asyncio.run(call(b"x" * 6).body(100, budget))
    with pytest.raises(Busy) as refused:
        asyncio.run(call(b"x" * 6).body(100, budget))
    assert refused.value.status == 503 and refused.value.extra == {"limit": 10}
    budget.give(6)
    asyncio.run(call(b"x" * 6).body(100, budget))


@pytest.mark.parametrize(("exc", "status", "suffix"), [
    (ValueError("bad name"), 400, "sdcp-bad-request"),
    (ConnectionResetError("gone"), 400, "mlc-incomplete-body"),
    (RuntimeError("secret internal state"), 500, "sdcp-internal-error"),
])
def test_a_failure_is_a_problem_document_without_a_traceback(exc, status, suffix):
    response = answer_for(exc, "PUT", "/objects/x")
    doc = json.loads(response.body)
    assert response.status == doc["status"] == status and doc["type"].endswith(suffix)
    assert "secret" not in response.body.decode() and "Traceback" not in response.body.decode()


def test_a_released_body_frees_its_bytes_unless_still_viewed():
    free, viewed = bytearray(b"abc"), bytearray(b"abc")
    view = memoryview(viewed)
    release_body(free)
    release_body(viewed)
    assert free == b"" and bytes(view) == b"abc"


@pytest.mark.parametrize("n", [0, 1, 23, 24, 255, 256, 1024])
def test_a_batch_answer_is_its_entries_answers_in_deterministic_cbor(n):
    from sdcp_fast.commitlog import Fenced, PreconditionFailed
    from sdcp_fast.mlc_server.server_requests import batch_answer, entry_answer
    from sdcp_fast.protocol import cbor

    kinds = [lambda i: f'"{i}"', lambda i: PreconditionFailed(f"log has {i} records"),
             lambda i: Fenced("fenced", extra={"fence": i}), lambda i: ValueError("bad"), lambda i: f'"{1 << 40}"']
    results = [kinds[i % len(kinds)](i) for i in range(n)]
    assert batch_answer(results) == cbor.deterministic_cbor({"results": [entry_answer(r) for r in results]})
