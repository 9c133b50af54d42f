"""The store in this process (sdcp_fast/store/local_store.py): the embedded default is the cache
plus the commit logs under its root, and its calls keep the event loop free."""

from __future__ import annotations

import asyncio
import threading

from sdcp_fast.cache import object_uri
from sdcp_fast.commitlog import open_commit_log
from sdcp_fast.protocol.commitlog import FenceRecord
from sdcp_fast.store import embedded
from sdcp_fast.store.local_store import INLINE_BYTES

SCOPE, S = bytes(16), bytes(16)
LOG = object_uri(SCOPE, S, "commit_log")


def test_the_embedded_store_is_the_cache_plus_its_logs(tmp_path):
    async def scenario(store):
        q = object_uri(SCOPE, S, "q_rows", 1)
        await store.put(q, b"rows")
        assert bytes(await store.get(q)) == b"rows" and store.mlc.stats()["index"]["max_objects"] == 4
        assert await (await store.commit_log(LOG)).append(FenceRecord(1), '"0"') == '"1"'
        other = object_uri(SCOPE, b"\x01" * 16, "commit_log")
        await (await store.commit_log(other)).append(FenceRecord(1), None)
        assert store.logs.open_count == 1

    with embedded(str(tmp_path), host_bytes=1 << 16, disk_bytes=1 << 16, max_open_logs=1, max_objects=4) as store:
        asyncio.run(scenario(store))
        assert store.logs.log(LOG).read().records == [FenceRecord(1)]
    assert (tmp_path / "logs").is_dir()
    assert open_commit_log(LOG, root=str(tmp_path)).read().records == [FenceRecord(1)], "the file outlives the store"


def test_a_got_object_is_the_callers_own(tmp_path):
    async def scenario(store):
        q = object_uri(SCOPE, S, "q_rows", 1)
        await store.put(q, b"rows")
        got = await store.get(q)
        got[0] = ord("R")
        return bytes(got), bytes(await store.get(q))

    with embedded(str(tmp_path)) as store:
        assert asyncio.run(scenario(store)) == (b"Rows", b"rows")


def test_small_calls_run_inline_and_large_copies_on_a_worker_thread(tmp_path):
    """A thread hop costs more than a call on a small object; a large copy must not hold up
    the event loop."""
    small, large = object_uri(SCOPE, S, "q_rows", 1), object_uri(SCOPE, S, "q_rows", 2)
    threads: list[str] = []

    with embedded(str(tmp_path)) as store:
        real = store.mlc.get

        def spy(uri):
            threads.append(threading.current_thread().name)
            return real(uri)

        store.mlc.get = spy  # type: ignore[method-assign]

        async def scenario():
            await store.put(small, b"x" * 16)
            await store.put(large, bytes(INLINE_BYTES + 1))
            await store.get(small)
            await store.get(large)

        asyncio.run(scenario())
    assert threads[0] == threading.main_thread().name and threads[1] != threading.main_thread().name


def test_the_loop_never_waits_behind_a_store_busy_with_a_large_copy(tmp_path):
    """While another thread holds the cache's lock (a large copy), a call goes to a worker
    thread and the event loop keeps running other tasks."""
    q = object_uri(SCOPE, S, "q_rows", 1)
    with embedded(str(tmp_path)) as store:
        store.mlc.put(q, b"rows")
        held, release = threading.Event(), threading.Event()

        def long_copy() -> None:
            with store.mlc._lock:
                held.set()
                release.wait(10)

        holder = threading.Thread(target=long_copy)
        holder.start()
        held.wait(5)

        async def scenario():
            ticks = 0
            get = asyncio.create_task(store.get(q))
            while ticks < 20:
                await asyncio.sleep(0.005)
                ticks += 1
            assert not get.done()
            release.set()
            return bytes(await get), ticks

        try:
            assert asyncio.run(scenario()) == (b"rows", 20)
        finally:
            release.set()
            holder.join(10)



def test_appends_that_are_not_fsyncd_run_inline_and_fsyncd_ones_on_a_worker_thread(tmp_path, monkeypatch):
    """A store whose logs go with its run (``sync_logs=False``) appends on the loop's thread
    and never flushes; a durable one waits for its flush off the loop."""
    from sdcp_fast.commitlog import file
    from sdcp_fast.store.interface import LogAppend

    flushes: list[int] = []
    real_flush = file.os.fdatasync
    monkeypatch.setattr(file.os, "fdatasync", lambda fd: (flushes.append(fd), real_flush(fd))[1])
    for sync in (False, True):
        threads: list[str] = []
        flushes.clear()
        with embedded(str(tmp_path / str(sync)), sync_logs=sync) as store:
            real = store.logs.append_many

            def spy(batch, real=real, threads=threads):
                threads.append(threading.current_thread().name)
                return real(batch)

            store.logs.append_many = spy  # type: ignore[method-assign]

            async def scenario(store=store):
                log = await store.commit_log(LOG)
                return await store.append_batch([LogAppend(log, FenceRecord(1), '"0"')])

            assert asyncio.run(scenario()) == ['"1"']
            assert store.logs.log(LOG).read().records == [FenceRecord(1)]
        assert (threads == [threading.main_thread().name]) is not sync, (sync, threads)
        assert bool(flushes) is sync, (sync, flushes)
