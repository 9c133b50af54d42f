"""The store's contract (sdcp_fast/store/interface.py), the same for both implementations: the
cache in this process (LocalStore) and an ``sdcp-fast mlc`` server reached over HTTP/2
(RemoteStore). Objects, leases, commit logs, and the failures each raises."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator

import pytest
import torch

from sdcp_fast.cache import ObjectLeased, ObjectUnavailable, UnknownLease, object_uri
from sdcp_fast.commitlog import Fenced, PreconditionFailed
from sdcp_fast.protocol.commitlog import CommitRecord, FenceRecord
from sdcp_fast.store import RemoteStore, Store, embedded
from tests.mlc_server.serverkit import serving

SCOPE, S = bytes(range(16)), b"s" * 16
Q = object_uri(SCOPE, S, "q_rows", 1)
LOG = object_uri(SCOPE, S, "commit_log")


@pytest.fixture(params=["local", "remote"])
def opened(request, tmp_path) -> Iterator[Callable[[], Store]]:
    """Opens the store under test (inside the test's event loop)."""
    with embedded(str(tmp_path), host_bytes=1 << 20, disk_bytes=1 << 22) as local:
        if request.param == "local":
            yield lambda: local
        else:
            with serving(local.mlc, logs=local.logs, http2=True) as base:
                yield lambda: RemoteStore(base)


def run(opened: Callable[[], Store], scenario) -> object:
    async def main() -> object:
        store = opened()
        try:
            return await scenario(store)
        finally:
            await store.aclose()

    return asyncio.run(main())


def commit(epoch: int, round_: int) -> CommitRecord:
    return CommitRecord(epoch=epoch, round=round_, emitted=(round_,), committed=round_, digest=bytes(32))


def test_objects_put_get_head_delete(opened):
    async def scenario(store: Store):
        assert await store.put(Q, b"rows") is None
        got = await store.get(Q)
        head = await store.head(Q)
        await store.delete(Q)
        with pytest.raises(ObjectUnavailable):
            await store.get(Q)
        with pytest.raises(ObjectUnavailable):
            await store.head(Q)
        return bytes(got), head.size

    assert run(opened, scenario) == (b"rows", 4)


def test_a_tensor_is_stored_as_its_bytes(opened):
    rows = torch.arange(12, dtype=torch.float32).reshape(3, 4)

    async def scenario(store: Store):
        await store.put(Q, rows)
        return bytes(await store.get(Q))

    assert run(opened, scenario) == rows.numpy().tobytes()


def test_a_lease_pins_the_object_until_released(opened):
    async def scenario(store: Store):
        lease = await store.put(Q, b"rows", 30.0)
        assert isinstance(lease, str) and (await store.head(Q)).leased
        with pytest.raises(ObjectLeased):
            await store.delete(Q)
        await store.release(lease)
        with pytest.raises(UnknownLease):
            await store.release(lease)
        await store.delete(Q)

    run(opened, scenario)


def test_a_lease_released_with_drop_deletes_the_spent_object(opened):
    async def scenario(store: Store):
        lease = await store.put(Q, b"rows", 30.0)
        assert lease is not None
        await store.release(lease, drop=True)
        with pytest.raises(ObjectUnavailable):
            await store.get(Q)
        with pytest.raises(UnknownLease):
            await store.release(lease, drop=True)

    run(opened, scenario)


def test_commit_logs_append_on_the_tag_and_are_fenced(opened):
    async def scenario(store: Store):
        log = await store.commit_log(LOG)
        empty = await log.read()
        assert (empty.records, empty.etag) == ([], '"0"')
        assert await log.append(commit(1, 1), '"0"') == '"1"'
        with pytest.raises(PreconditionFailed):
            await log.append(commit(1, 2), '"0"')
        assert await log.append(FenceRecord(2), None) == '"2"'
        with pytest.raises(Fenced):
            await log.append(commit(1, 2), '"2"')
        again = await (await store.commit_log(LOG)).read(1)
        return again.records, again.etag

    assert run(opened, scenario) == ([FenceRecord(2)], '"2"')


def test_a_file_log_is_opened_by_its_own_backend(opened, tmp_path):
    ref = "file://" + str(tmp_path / "elsewhere.log")

    async def scenario(store: Store):
        log = await store.commit_log(ref)
        await log.append(commit(1, 1), None)
        return (await log.read()).records

    assert run(opened, scenario) == [commit(1, 1)]


def test_a_reference_no_backend_serves_is_a_value_error(opened):
    async def scenario(store: Store):
        with pytest.raises(ValueError):
            await store.commit_log("gopher://nowhere/log")

    run(opened, scenario)
