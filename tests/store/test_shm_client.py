"""Objects of an MLC node on this host through its shared memory (sdcp_fast/store/shm_client.py,
sdcp_fast/cache/tiers/shm.py): written once into a slot, read in place, freed with their lease
even when their writer died, and never another object's bytes."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from sdcp_fast.cache import object_uri
from sdcp_fast.cache.failures import ObjectUnavailable
from sdcp_fast.cache.tiers.shm import ShmTier
from sdcp_fast.store import RemoteStore, embedded, shm_client
from tests.mlc_server.serverkit import Served, serving

ROWS = 32_000 * 4 * 4  # the q rows of a 4-token proposal at V = 32,000


def uri(n: int) -> str:
    return object_uri(bytes(16), bytes(16), "q_rows", n)


@contextmanager
def node(tmp_path: Any, clock: Any = time.monotonic, shm: str | None = "/dev/shm") -> Iterator[tuple[Any, Served]]:
    with embedded(str(tmp_path), shm=shm, clock=clock) as store, serving(store.mlc, logs=store.logs,
                                                                         http2=True) as base:
        yield store, base


def tier(store: Any) -> ShmTier:
    shm = store.mlc.tiers[0]
    assert isinstance(shm, ShmTier)
    return shm


def slots(store: Any) -> list[str]:
    return sorted(n for n in os.listdir(tier(store).folder) if n.startswith("slot-"))


def run(coro_fn: Any, base: str, **kw: Any) -> Any:
    async def scenario() -> Any:
        store = RemoteStore(base, **kw)
        try:
            return await coro_fn(store)
        finally:
            await store.aclose()

    return asyncio.run(scenario())


def test_same_host_rows_go_through_a_slot_and_read_as_the_network_path(tmp_path):
    data = os.urandom(ROWS)
    with node(tmp_path) as (store, base):
        async def put_and_read(s: RemoteStore) -> tuple[bytes, bool, list[str]]:
            lease = await s.put(uri(1), data, 30.0)
            assert lease is not None
            view = await s.get(uri(1))
            in_place = isinstance(view.obj, __import__("mmap").mmap)
            return bytes(view), in_place, slots(store)

        got, in_place, held = run(put_and_read, base)
        network = run(lambda s: s.get(uri(1)), base, shm=False)
        assert got == bytes(network) == data
        assert in_place and held == ["slot-1"]
        assert store.mlc.head(uri(1)).leased and store.mlc.head(uri(1)).tier == "host"
        # Written over the network, the same object is the same bytes through either client.
        run(lambda s: s.put(uri(2), data), base, shm=False)
        assert bytes(run(lambda s: s.get(uri(2)), base)) == data and slots(store) == ["slot-1"]


def test_a_released_slot_is_unlinked_and_its_reader_gets_the_missing_objects_error(tmp_path):
    with node(tmp_path) as (store, base):
        async def scenario(s: RemoteStore) -> None:
            lease = await s.put(uri(1), b"\1" * ROWS, 30.0)
            assert lease is not None
            await s.release(lease, drop=True)
            assert slots(store) == []
            with pytest.raises(ObjectUnavailable):
                await s.get(uri(1))

        run(scenario, base)


def test_a_read_racing_a_free_gets_the_missing_objects_error(tmp_path, monkeypatch):
    with node(tmp_path) as (store, base):
        async def scenario(s: RemoteStore) -> None:
            lease = await s.put(uri(1), b"\1" * ROWS, 30.0)
            assert lease is not None
            # The slot is freed between the reader's map and its check.
            monkeypatch.setattr(shm_client, "after_map", lambda: store.mlc.release(lease, drop=True))
            with pytest.raises(ObjectUnavailable):
                await s.get(uri(1))

        run(scenario, base)


def test_a_read_racing_a_reuse_gets_the_new_object_and_an_earlier_view_keeps_its_own_bytes(tmp_path, monkeypatch):
    first, second = b"\1" * ROWS, b"\2" * ROWS
    with node(tmp_path) as (store, base):
        async def scenario(s: RemoteStore) -> tuple[memoryview, bytes]:
            await s.put(uri(1), first)
            early = await s.get(uri(1))

            def replace() -> None:  # between the map and the check, once
                monkeypatch.setattr(shm_client, "after_map", lambda: None)
                store.mlc.put(uri(1), second)

            monkeypatch.setattr(shm_client, "after_map", replace)
            return early, bytes(await s.get(uri(1)))

        early, racing = run(scenario, base)
        assert racing == second  # never the freed slot's bytes: asked again
        assert bytes(early) == first  # replaced since: still its own object's bytes


def test_a_freed_slot_fails_its_check_after_the_mapping(tmp_path, monkeypatch):
    with node(tmp_path) as (store, base):
        run(lambda s: s.put(uri(1), b"\1" * ROWS), base)
        slot = tier(store).slot_of(store.mlc.get(uri(1)))
        assert slot is not None
        monkeypatch.setattr(shm_client, "after_map", lambda: store.mlc.delete(uri(1)))
        with pytest.raises(ObjectUnavailable):
            shm_client.map_slot(tier(store).folder, slot[0], slot[1], ROWS)


def test_a_node_on_another_host_is_reached_over_the_network(tmp_path):
    data = os.urandom(ROWS)
    with node(tmp_path) as (store, base):
        # A folder of the same name on another host holds another node's token (or none).
        with open(os.path.join(tier(store).folder, "node.id"), "w") as f:
            f.write(f"{'0' * 32} 1\n")

        async def scenario(s: RemoteStore) -> bytes:
            await s.put(uri(1), data, 30.0)
            got = await s.get(uri(1))
            assert s.shm is not None and s.shm.folder is None
            return bytes(got)

        assert run(scenario, base) == data
        assert slots(store) == [] and tier(store).adopted == 0


def test_a_node_without_shared_memory_is_reached_over_the_network(tmp_path):
    data = os.urandom(ROWS)
    with node(tmp_path, shm=None) as (_, base):
        async def scenario(s: RemoteStore) -> bytes:
            await s.put(uri(1), data, 30.0)
            return bytes(await s.get(uri(1)))

        assert run(scenario, base) == data


WRITER = """
import asyncio, sys
from sdcp_fast.cache import object_uri
from sdcp_fast.store import RemoteStore

async def main():
    store = RemoteStore(sys.argv[1])
    await store.put(object_uri(bytes(16), bytes(16), "q_rows", 1), b"\\7" * int(sys.argv[2]), 5.0)
    print("put", flush=True)
    await asyncio.sleep(3600)

asyncio.run(main())
"""


def test_the_lease_expiry_frees_the_slot_of_a_writer_killed_with_9(tmp_path, clock):
    with node(tmp_path, clock=clock) as (store, base):
        writer = subprocess.Popen([sys.executable, "-c", WRITER, base, str(ROWS)], stdout=subprocess.PIPE,
                                  stderr=subprocess.DEVNULL, cwd=os.getcwd())
        try:
            assert writer.stdout is not None and writer.stdout.readline() == b"put\n"
        finally:
            writer.send_signal(signal.SIGKILL)
            writer.wait(30)
        assert slots(store) == ["slot-1"] and store.mlc.head(uri(1)).leased
        clock.advance(5.1)
        assert not store.mlc.contains(uri(1))  # any call reaps the expired lease
        assert slots(store) == []
        with pytest.raises(ObjectUnavailable):
            run(lambda s: s.get(uri(1)), base)


def test_an_upload_the_node_does_not_find_goes_over_the_network(tmp_path):
    """A node restarted with another folder: the client asks again and sends the bytes."""
    data = os.urandom(ROWS)
    with node(tmp_path) as (store, base):
        async def scenario(s: RemoteStore) -> bytes:
            assert s.shm is not None and await s.shm.usable()
            s.shm.folder = str(tmp_path)  # where the node will not look
            await s.put(uri(1), data, 30.0)
            assert s.shm.folder is None and not [n for n in os.listdir(tmp_path) if n.startswith("up-")]
            return bytes(await s.get(uri(1)))

        assert run(scenario, base) == data
        assert tier(store).adopted == 0


def test_a_same_host_read_finds_the_slot_by_name_without_a_request(tmp_path, monkeypatch):
    data = os.urandom(ROWS)
    with node(tmp_path) as (store, base):
        async def scenario(s: RemoteStore) -> bytes:
            await s.put(uri(1), data, 30.0)
            assert s.shm is not None

            async def no_request(*_: Any, **__: Any) -> Any:
                raise AssertionError("the node was asked")

            monkeypatch.setattr(s.shm, "_call", no_request)
            return bytes(await s.get(uri(1)))

        assert run(scenario, base) == data


def test_a_slot_past_its_birth_lease_deadline_is_not_read_by_name(tmp_path, monkeypatch):
    """The node reaps expired leases lazily: by name, a slot is trusted only within the
    deadline its header carries, and after it the node says whether the object is there."""
    with node(tmp_path) as (store, base):
        async def scenario(s: RemoteStore) -> None:
            await s.put(uri(1), b"\1" * ROWS, 5.0)
            start = time.monotonic_ns()
            monkeypatch.setattr(shm_client.time, "monotonic_ns", lambda: start + 5_000_000_001)
            assert shm_client.map_named(tier(store).folder, uri(1)) is None

        run(scenario, base)


def test_a_slot_linked_under_another_name_is_never_read_as_that_object(tmp_path):
    with node(tmp_path) as (store, base):
        run(lambda s: s.put(uri(1), b"\1" * ROWS, 30.0), base)
        names = tier(store).names
        (mine,) = os.listdir(names)
        other = shm_client.name_digest(uri(2)).hex()
        os.link(os.path.join(names, mine), os.path.join(names, other))
        assert shm_client.map_named(tier(store).folder, uri(2)) is None
        with pytest.raises(ObjectUnavailable):
            run(lambda s: s.get(uri(2)), base)
        assert bytes(run(lambda s: s.get(uri(1)), base)) == b"\1" * ROWS


def test_a_lease_let_go_of_is_released_with_the_next_put_without_a_request_of_its_own(tmp_path, monkeypatch):
    with node(tmp_path) as (store, base):
        async def scenario(s: RemoteStore) -> None:
            first = await s.put(uri(1), b"\1" * ROWS, 30.0)
            assert first is not None and s.shm is not None
            monkeypatch.setattr(shm_client, "SPENT_WAIT", 3600.0)  # no flush: only the put may take it

            async def no_release(*_: Any) -> None:
                raise AssertionError("released on its own")

            monkeypatch.setattr(s.shm, "_release", no_release)
            assert s.shm.release_later(first)
            assert store.mlc.contains(uri(1))
            await s.put(uri(2), b"\2" * ROWS, 30.0)
            assert not store.mlc.contains(uri(1)) and store.mlc.contains(uri(2))
            assert slots(store) == ["slot-2"]

        run(scenario, base)


def test_a_lease_no_put_takes_is_released_on_its_own(tmp_path, monkeypatch):
    monkeypatch.setattr(shm_client, "SPENT_WAIT", 0.01)
    with node(tmp_path) as (store, base):
        async def scenario(s: RemoteStore) -> None:
            lease = await s.put(uri(1), b"\1" * ROWS, 30.0)
            assert lease is not None and s.shm is not None and s.shm.release_later(lease)
            deadline = time.monotonic() + 30
            while store.mlc.contains(uri(1)) and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            assert not store.mlc.contains(uri(1)) and slots(store) == []

        run(scenario, base)


def test_a_put_with_a_malformed_release_list_is_refused_before_it_is_made(tmp_path):
    with node(tmp_path) as (store, base):
        async def scenario(s: RemoteStore) -> None:
            assert s.shm is not None and await s.shm.usable()
            s.shm._spent = ["not-a-lease"]
            # Refused as a bad request: the client falls back to the network path.
            await s.put(uri(1), b"\1" * ROWS, 30.0)
            assert tier(store).adopted == 0 and store.mlc.contains(uri(1))

        run(scenario, base)


def kept_files(store: Any) -> list[str]:
    return sorted(n for n in os.listdir(tier(store).folder) if n.startswith("w-"))


def test_a_kept_file_is_written_again_only_once_the_node_freed_its_object(tmp_path):
    a, b, c = os.urandom(ROWS), os.urandom(ROWS), os.urandom(ROWS)
    with node(tmp_path) as (store, base):
        async def scenario(s: RemoteStore) -> None:
            assert s.shm is not None
            s.shm.keep = True
            first = await s.put(uri(1), a, 30.0)
            await s.put(uri(2), b, 30.0)
            assert first is not None and len(kept_files(store)) == 2
            await s.put(uri(3), c, 30.0)  # both still objects: a third file
            assert len(kept_files(store)) == 3
            await s.release(first, drop=True)
            await s.put(uri(4), b"\4" * ROWS, 30.0)  # into the first one's pages
            assert len(kept_files(store)) == 3
            for n, data in ((2, b), (3, c), (4, b"\4" * ROWS)):
                got = await s.get(uri(n))
                assert bytes(got) == data and not isinstance(got.obj, __import__("mmap").mmap)  # a checked copy
            with pytest.raises(ObjectUnavailable):
                await s.get(uri(1))

        run(scenario, base)


def test_a_reader_of_a_kept_slot_rewritten_during_its_copy_gets_the_missing_objects_error(tmp_path, monkeypatch):
    with node(tmp_path) as (store, base):
        async def scenario(s: RemoteStore) -> None:
            assert s.shm is not None
            s.shm.keep = True
            lease = await s.put(uri(1), b"\1" * ROWS, 30.0)
            assert lease is not None

            def free_and_rewrite() -> None:  # between the copy and its check: freed, then written again
                store.mlc.release(lease, drop=True)
                (kept,) = kept_files(store)
                with open(os.path.join(tier(store).folder, kept), "r+b") as f:
                    f.seek(4096)
                    f.write(b"\2" * ROWS)

            monkeypatch.setattr(shm_client, "after_map", free_and_rewrite)
            with pytest.raises(ObjectUnavailable):
                await s.get(uri(1))

        run(scenario, base)


def test_a_writer_keeps_no_file_a_response_still_viewed_when_it_was_freed(tmp_path):
    with node(tmp_path) as (store, base):
        async def scenario(s: RemoteStore) -> None:
            assert s.shm is not None
            s.shm.keep = True
            lease = await s.put(uri(1), b"\1" * ROWS, 30.0)
            assert lease is not None
            viewed = store.mlc.get(uri(1))  # as a response being sent over the network
            await s.release(lease, drop=True)
            (kept,) = s.shm._kept
            assert not kept.recyclable() and bytes(viewed) == b"\1" * ROWS
            await s.put(uri(2), b"\2" * ROWS, 30.0)  # a new file: the viewed one is never rewritten
            assert len(kept_files(store)) == 2 and bytes(viewed) == b"\1" * ROWS

        run(scenario, base)
