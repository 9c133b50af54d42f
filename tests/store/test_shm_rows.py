"""A drafter's q rows through the node's shared memory, one slot per session
(sdcp_fast/store/shm_client.py ``Rolling``, ``RowsMap``): leased at the session's first round,
rewritten in place under a seqlock after, read in place by name, and released when the session
ends or freed when its lease expires; a reader never takes another round's bytes."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from typing import Any

import pytest

from sdcp_fast.cache import object_uri
from sdcp_fast.cache.failures import ObjectUnavailable
from sdcp_fast.cache.tiers.shm import rows_slot
from sdcp_fast.cache.uri import writer_tag
from sdcp_fast.store import RemoteStore, shm_client
from tests.store.test_shm_client import ROWS, node, slots, tier

TAG = writer_tag("https://drafter.test")


def uri(n: int, session: bytes = bytes(16)) -> str:
    return object_uri(bytes(16), session, "q_rows", n, tag=TAG)


def rows(n: int) -> bytes:
    return bytes([n % 251]) * ROWS


class Counted:
    """The requests a store's client sends, by method and first path segment."""

    def __init__(self, store: RemoteStore) -> None:
        self.sent: list[tuple[str, str]] = []
        request = store.transport.request

        async def counted(base: str, method: str, path: str, **kw: Any) -> Any:
            if path != "shm":  # where the folder is: asked once per node
                self.sent.append((method, path.split("/")[0]))
            return await request(base, method, path, **kw)

        store.transport.request = counted  # type: ignore[method-assign]


def run(scenario: Any, base: str) -> Any:
    """``scenario(writer, reader, sent)``: two clients of the node, as a drafter and a verifier."""

    async def both() -> Any:
        writer, reader = RemoteStore(base), RemoteStore(base)
        assert writer.shm is not None
        writer.shm.rolling = True
        sent = Counted(writer), Counted(reader)
        try:
            return await scenario(writer, reader, sent)
        finally:
            await writer.aclose()
            await reader.aclose()

    return asyncio.run(both())


def test_a_session_puts_its_slot_once_and_each_round_is_read_in_place_without_a_request(tmp_path):
    with node(tmp_path) as (store, base):
        async def scenario(w: RemoteStore, r: RemoteStore, sent: tuple[Counted, Counted]) -> None:
            for n in range(1, 6):
                assert await w.put(uri(n), rows(n), 30.0) is None  # the slot's lease, not the round's
                view = await r.get(uri(n))
                assert type(view.obj) is shm_client.RowsMap and bytes(view) == rows(n)
            assert sent[0].sent == [("PUT", "objects")] and sent[1].sent == []
            assert slots(store) == ["slot-1"] and tier(store).adopted == 1
            slot = rows_slot(uri(1))
            assert slot is not None and store.mlc.head(slot).leased  # held, and counted in its scope, as an object

        run(scenario, base)


def test_a_reader_of_an_earlier_round_gets_the_missing_objects_error_never_the_next_rounds_bytes(tmp_path):
    with node(tmp_path) as (store, base):
        async def scenario(w: RemoteStore, r: RemoteStore, _: Any) -> None:
            await w.put(uri(1), rows(1), 30.0)
            await w.put(uri(2), rows(2), 30.0)
            with pytest.raises(ObjectUnavailable):
                await r.get(uri(1))
            assert bytes(await r.get(uri(2))) == rows(2)
            with pytest.raises(ObjectUnavailable):  # nor another session's, or a round not written
                await r.get(uri(3))
            with pytest.raises(ObjectUnavailable):
                await r.get(uri(2, session=b"\1" * 16))

        run(scenario, base)


def test_a_round_is_read_in_place_without_awaiting_once_the_folder_is_known(tmp_path):
    with node(tmp_path) as (store, base):
        async def scenario(w: RemoteStore, r: RemoteStore, _: Any) -> None:
            assert r.shm is not None and w.shm is not None
            await w.put(uri(1), rows(1), 30.0)
            assert r.shm.in_place(uri(1)) is None  # the node not asked yet where its folder is
            assert bytes(await r.get(uri(1))) == rows(1)
            view = r.shm.in_place(uri(1))
            assert view is not None and bytes(view) == rows(1)
            await w.put(uri(2), rows(2), 30.0)
            assert r.shm.in_place(uri(1)) is None and r.shm.in_place(uri(3)) is None

        run(scenario, base)


def test_rows_rewritten_after_they_were_read_fail_their_check(tmp_path):
    with node(tmp_path) as (store, base):
        async def scenario(w: RemoteStore, r: RemoteStore, _: Any) -> None:
            await w.put(uri(1), rows(1), 30.0)
            view = await r.get(uri(1))
            guard = shm_client.rows_guard(view)
            assert guard is not None and guard()
            await w.put(uri(2), rows(2), 30.0)  # the writer moved on while the kernels read round 1
            assert not guard()
            again = await r.get(uri(2))
            guard = shm_client.rows_guard(again)
            assert guard is not None and guard()

        run(scenario, base)


def test_rows_being_written_are_not_read_and_a_write_during_a_read_fails_its_check(tmp_path, monkeypatch):
    with node(tmp_path) as (store, base):
        async def scenario(w: RemoteStore, r: RemoteStore, _: Any) -> None:
            await w.put(uri(1), rows(1), 30.0)
            view = await r.get(uri(1))
            guard = shm_client.rows_guard(view)
            assert guard is not None
            assert w.shm is not None
            roll = next(iter(w.shm._rolls.values()))
            shm_client.write_seq(roll.mm, roll.seq + 1)  # a writer between its two stores
            assert not guard()
            with pytest.raises(ObjectUnavailable):
                await r.get(uri(1))

        run(scenario, base)


def test_the_session_end_releases_the_slot_and_its_readers_get_the_missing_objects_error(tmp_path, monkeypatch):
    monkeypatch.setattr(shm_client, "SLOT_WAIT", 0.01)
    with node(tmp_path) as (store, base):
        async def scenario(w: RemoteStore, r: RemoteStore, sent: tuple[Counted, Counted]) -> None:
            await w.put(uri(1), rows(1), 30.0)
            view = await r.get(uri(1))
            guard = shm_client.rows_guard(view)
            assert guard is not None and w.shm is not None
            w.shm.end_rows(uri(1))
            for _ in range(500):  # released on its own (no put to ride on) once SLOT_WAIT passed
                if not slots(store):
                    break
                await asyncio.sleep(0.01)
            assert slots(store) == [] and ("DELETE", "leases") in sent[0].sent
            assert not guard() and bytes(view) == rows(1)  # the view keeps its round's bytes
            with pytest.raises(ObjectUnavailable):
                await r.get(uri(1))
            await w.put(uri(2), rows(2), 30.0)  # the session again: a new slot
            assert bytes(await r.get(uri(2))) == rows(2) and slots(store) == ["slot-2"]

        run(scenario, base)


def test_a_slot_near_its_lease_end_is_renewed_without_a_new_slot(tmp_path, monkeypatch):
    monkeypatch.setattr(shm_client, "RENEW_AT", 0.0)  # renewed at every round
    with node(tmp_path) as (store, base):
        async def scenario(w: RemoteStore, r: RemoteStore, sent: tuple[Counted, Counted]) -> None:
            for n in range(1, 4):
                await w.put(uri(n), rows(n), 30.0)
                assert bytes(await r.get(uri(n))) == rows(n)
            assert sent[0].sent == [("PUT", "objects"), ("PUT", "leases"), ("PUT", "leases")]
            assert slots(store) == ["slot-1"]

        run(scenario, base)


def test_rows_larger_than_the_slot_go_into_a_new_slot_under_the_same_name(tmp_path):
    with node(tmp_path) as (store, base):
        async def scenario(w: RemoteStore, r: RemoteStore, sent: tuple[Counted, Counted]) -> None:
            small = rows(1)[: ROWS // 2]
            assert await w.put(uri(1), small, 30.0) is None
            assert await w.put(uri(2), rows(2), 30.0) is None  # a slot of its own, not the round's object
            assert bytes(await r.get(uri(2))) == rows(2) and slots(store) == ["slot-2"]
            assert sent[0].sent == [("PUT", "objects"), ("DELETE", "leases"), ("PUT", "objects")]

        run(scenario, base)


def test_a_freed_slot_is_replaced_by_the_writers_next_round(tmp_path):
    with node(tmp_path) as (store, base):
        async def scenario(w: RemoteStore, r: RemoteStore, _: Any) -> None:
            await w.put(uri(1), rows(1), 30.0)
            slot = rows_slot(uri(1))
            assert slot is not None
            assert w.shm is not None
            store.mlc.release(w.shm._rolls[slot].lease, drop=True)  # freed under the writer (as by an expiry)
            with pytest.raises(ObjectUnavailable):
                await r.get(uri(1))
            await w.put(uri(2), rows(2), 30.0)
            assert bytes(await r.get(uri(2))) == rows(2) and slots(store) == ["slot-2"]

        run(scenario, base)


WRITER = """
import asyncio, sys
from sdcp_fast.cache import object_uri
from sdcp_fast.store import RemoteStore

async def main():
    store = RemoteStore(sys.argv[1])
    store.shm.rolling = True
    for n in (1, 2):
        await store.put(object_uri(bytes(16), bytes(16), "q_rows", n, tag=sys.argv[3]), b"\\7" * int(sys.argv[2]), 5.0)
    print("put", flush=True)
    await asyncio.sleep(3600)

asyncio.run(main())
"""


def test_the_lease_expiry_frees_the_slot_of_a_writer_killed_with_9(tmp_path, clock):
    with node(tmp_path, clock=clock) as (store, base):
        writer = subprocess.Popen([sys.executable, "-c", WRITER, base, str(ROWS), TAG], stdout=subprocess.PIPE,
                                  stderr=subprocess.DEVNULL, cwd=os.getcwd())
        try:
            assert writer.stdout is not None and writer.stdout.readline() == b"put\n"
        finally:
            writer.send_signal(signal.SIGKILL)
            writer.wait(30)
        slot = rows_slot(uri(1))
        assert slot is not None and slots(store) == ["slot-1"] and store.mlc.head(slot).leased
        clock.advance(5.1)
        assert not store.mlc.contains(slot)  # any call reaps the expired lease
        assert slots(store) == []
        with pytest.raises(ObjectUnavailable):
            run(lambda w, r, _: r.get(uri(2)), base)


def test_a_writer_whose_slot_name_is_held_puts_each_round_as_an_object_of_its_own(tmp_path):
    """A drafter restarted under the same tag while its predecessor's lease on the session's
    slot runs: the node refuses the slot, the rounds go as before, and read as before."""
    with node(tmp_path) as (store, base):
        async def scenario(w: RemoteStore, r: RemoteStore, sent: tuple[Counted, Counted]) -> None:
            await w.put(uri(1), rows(1), 30.0)
            again = RemoteStore(base)
            assert again.shm is not None
            again.shm.rolling = True
            try:
                for n in (2, 3):
                    assert await again.put(uri(n), rows(n), 30.0) is not None  # the round's own lease
                    assert bytes(await r.get(uri(n))) == rows(n)
                assert tier(store).adopted == 3  # the slot, then two rounds: the slot asked for once
            finally:
                await again.aclose()

        run(scenario, base)


def test_a_reader_on_another_host_gets_the_round_from_the_slot_over_the_network(tmp_path):
    with node(tmp_path) as (store, base):
        async def scenario(w: RemoteStore, r: RemoteStore, _: Any) -> None:
            far = RemoteStore(base, shm=False)  # no shared memory: as from another host
            try:
                await w.put(uri(1), rows(1), 30.0)
                assert bytes(await far.get(uri(1))) == rows(1)
                await w.put(uri(2), rows(2), 30.0)
                with pytest.raises(ObjectUnavailable):  # the slot holds round 2 now
                    await far.get(uri(1))
                assert bytes(await far.get(uri(2))) == rows(2)
            finally:
                await far.aclose()

        run(scenario, base)


def test_a_slot_let_go_of_rides_on_the_next_sessions_put(tmp_path):
    with node(tmp_path) as (store, base):
        async def scenario(w: RemoteStore, r: RemoteStore, sent: tuple[Counted, Counted]) -> None:
            assert w.shm is not None
            await w.put(uri(1), rows(1), 30.0)
            w.shm.end_rows(uri(1))
            await asyncio.sleep(4 * shm_client.SPENT_WAIT)  # sessions end and start apart
            await w.put(uri(1, session=b"\1" * 16), rows(1), 30.0)  # the next session's first round
            assert sent[0].sent == [("PUT", "objects"), ("PUT", "objects")]  # no release of its own
            assert slots(store) == ["slot-2"]
            await asyncio.sleep(2 * shm_client.SLOT_WAIT)
            assert sent[0].sent == [("PUT", "objects"), ("PUT", "objects")]

        run(scenario, base)
