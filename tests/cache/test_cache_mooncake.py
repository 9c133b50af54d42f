"""The Mooncake Store tier against a real mooncake_master on loopback: the tier's operations,
demotion and eviction through an MLC, what a takeover reads placed where it outlives its
writer, an object read after its writer's process is killed, and the master's death."""

from __future__ import annotations

import argparse
import itertools
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import pytest

from sdcp_fast.cache import MLC, ObjectUnavailable, object_uri
from sdcp_fast.cache.tiers import mooncake
from sdcp_fast.cache.tiers.host import HostTier
from sdcp_fast.cache.tiers.mooncake import RETRY_AFTER_S, MooncakeConfig, MooncakeTier, TierUnreachable
from sdcp_fast.deploy.up import free_port
from tests.cache.mlc_mooncake import Master, running_master
from tests.cache.mooncake_writer import payload

pytestmark = pytest.mark.services
SCOPE = bytes(range(16))
SESSION = b"m" * 16
T = TypeVar("T")


def uri(kind: str, n: int | None = None) -> str:
    return object_uri(SCOPE, SESSION, kind, n)


def blob(n: int, size: int = 2048) -> bytes:
    return bytes([n]) * size


def until(check: Callable[[], T | None], what: str, deadline_s: float = 30.0) -> T:
    """``check()``'s first result that is not None, polled until the deadline."""
    deadline = time.monotonic() + deadline_s
    while True:
        got = check()
        if got is not None:
            return got
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {deadline_s} s")
        time.sleep(0.05)


@pytest.fixture(scope="module")
def master() -> Iterator[Master]:
    with running_master() as m:
        yield m


def test_put_get_delete_through_the_tier(master):
    tier = MooncakeTier(64 << 20, master.config(), prefix="t1:")
    try:
        handle = tier.write("small", blob(1))
        assert bytes(tier.read(handle)) == blob(1)
        assert bytes(tier.read_range(handle, 100, 200)) == blob(1)[100:200]
        assert tier.probe("small") == 2048
        big = payload(6 << 20)  # over half the 8 MiB transfer buffer: registered in place both ways
        assert bytes(tier.read(tier.write("big", big))) == big
        tier.drop(handle)  # just read: the master's read lease defers the removal a little

        def gone() -> bool | None:
            tier.flush()
            return True if tier.probe("small") is None else None

        until(gone, "the dropped object leaving the store")
        with pytest.raises(KeyError):
            tier.read(handle)
    finally:
        tier.close()


def test_demotion_to_mooncake_promotion_back_and_eviction(master, clock):
    mlc = MLC([HostTier(4096), MooncakeTier(8192, master.config(), prefix="t2:")], clock=clock)
    other = MooncakeTier(1 << 20, master.config(segment_bytes=0), prefix="t2:")
    try:
        for n in range(1, 7):
            mlc.put(uri("draft_kv", n), blob(n))
        assert [mlc.head(uri("draft_kv", n)).tier for n in range(1, 7)] == ["mooncake"] * 4 + ["host"] * 2
        assert bytes(mlc.get_range(uri("draft_kv", 1), 10, 20)) == blob(1)[10:20]
        mlc.put(uri("draft_kv", 7), blob(7))  # the store is full: its least recently used object goes
        with pytest.raises(ObjectUnavailable):
            mlc.head(uri("draft_kv", 2))
        assert other.probe(uri("draft_kv", 2)) is None, "an evicted object is removed from the store"
        assert bytes(mlc.get(uri("draft_kv", 3))) == blob(3)
        assert mlc.head(uri("draft_kv", 3)).tier == "host", "a read promotes an ordinary object"
        assert mlc.stats()["scopes"][SCOPE.hex()]["mooncake"]["objects"] == 4
    finally:
        other.close()
        mlc.close()


def test_what_a_takeover_reads_is_placed_in_mooncake_and_stays(master, clock):
    mlc = MLC([HostTier(1 << 20), MooncakeTier(1 << 20, master.config(), prefix="t3:")], clock=clock)
    other = MLC([HostTier(1 << 20), MooncakeTier(1 << 20, master.config(segment_bytes=0), prefix="t3:")],
                clock=clock)
    try:
        kept = [uri("target_kv", 4), uri("prompt_kv"), uri("committed_tokens", 4)]
        for n, name in enumerate(kept):
            assert mlc.put(name, blob(n + 1)).tier == "mooncake", name
        assert mlc.put(uri("draft_kv", 4), blob(9)).tier == "host", "the host tier had room"
        assert mlc.put(uri("committed_tokens", 5), b"").tier == "host", "the store refuses empty objects"
        assert bytes(mlc.get(kept[0])) == blob(1)
        assert mlc.head(kept[0]).tier == "mooncake", "a read leaves it where it outlives its writer"
        assert bytes(other.get(kept[1])) == blob(2), "another node reads it"
        mlc.delete(kept[2])
        with pytest.raises(ObjectUnavailable):
            other.get(kept[2])
    finally:
        other.close()
        mlc.close()


def test_an_object_outlives_its_writers_process(master):
    """The writer's MLC lends a segment too; with two copies one is in the reader's segment,
    so what it read is there after the writer is killed (its own memory gone with it)."""
    reader = MLC([HostTier(1 << 20), MooncakeTier(1 << 20, master.config())])
    name = uri("target_kv", 7)
    size = 300_000
    writer = subprocess.Popen([sys.executable, "-m", "tests.cache.mooncake_writer", master.address,
                               master.metadata, name, str(size)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              text=True)
    try:
        assert writer.stdout is not None
        assert writer.stdout.readline().strip() == "stored mooncake"
        writer.send_signal(signal.SIGKILL)
        writer.wait(timeout=30)

        def read() -> bytes | None:
            try:
                return bytes(reader.get(name))
            except TierUnreachable:  # a copy in the dead writer's segment, before the master drops it
                return None

        assert until(read, "reading the killed writer's object") == payload(size)
        assert reader.head(name).tier == "mooncake"
    finally:
        if writer.poll() is None:
            writer.kill()
            writer.wait()
        if writer.stdout is not None:
            writer.stdout.close()
        reader.close()


def test_the_masters_death_gives_clear_errors_and_no_hang(clock):
    with running_master() as m:
        tier = MooncakeTier(1 << 20, m.config())
        mlc = MLC([HostTier(1 << 20), tier], clock=clock)
        mlc.put(uri("target_kv", 1), blob(1))
        mlc.put(uri("draft_kv", 1), blob(2))
        mlc.put(uri("prompt_kv"), blob(4))
        m.kill()

        def after_death() -> None:
            with pytest.raises(TierUnreachable) as lost:
                mlc.get(uri("target_kv", 1))
            assert lost.value.status == 503 and m.address in str(lost.value)
            with pytest.raises(TierUnreachable):
                tier.probe("anything")
            with pytest.raises(ObjectUnavailable):  # a miss here is a miss, not the store's failure
                mlc.get(uri("q_rows", 9))
            assert mlc.put(uri("target_kv", 2), blob(3)).tier == "host", "this host keeps it instead"
            assert bytes(mlc.get(uri("draft_kv", 1))) == blob(2)
            mlc.delete(uri("prompt_kv"))  # the drop cannot be sent; this host's objects still serve
            assert bytes(mlc.get(uri("draft_kv", 1))) == blob(2)
            mlc.close()

        with ThreadPoolExecutor(1) as pool:
            pool.submit(after_death).result(timeout=120)


def test_a_master_that_does_not_answer_stalls_one_call_then_none(clock):
    """A cut-off master (stopped here: no reset, no answer) costs one RPC timeout under the
    MLC's lock, not one per call, and is used again once it answers."""
    with running_master() as m:
        tier = MooncakeTier(1 << 20, m.config())
        mlc = MLC([HostTier(1 << 20), tier], clock=clock)
        try:
            mlc.put(uri("draft_kv", 1), blob(1))
            m.proc.send_signal(signal.SIGSTOP)
            waits: list[float] = []

            def timed(call: Callable[..., T], *args: object) -> T:
                began = time.monotonic()
                try:
                    return call(*args)
                finally:
                    waits.append(time.monotonic() - began)

            started = time.monotonic()
            try:
                for n in range(1, 11):
                    assert timed(mlc.put, uri("target_kv", n), blob(n)).tier == "host", "this host keeps it"
                    assert bytes(timed(mlc.get, uri("draft_kv", 1))) == blob(1)
                    with pytest.raises(ObjectUnavailable):
                        timed(mlc.get, uri("q_rows", n))
            finally:
                m.proc.send_signal(signal.SIGCONT)
            elapsed = time.monotonic() - started
            stalled = [w for w in waits if w >= 1.0]  # the RPC timeout is 2 s
            assert stalled, "the first call waits for the master"
            assert len(stalled) <= 1 + elapsed / RETRY_AFTER_S, f"{len(stalled)} of {len(waits)} calls waited"

            def answers() -> bool | None:
                try:
                    return tier.probe("x") is None or None
                except TierUnreachable:
                    return None

            until(answers, "the master answering again")
            assert mlc.put(uri("target_kv", 20), blob(20)).tier == "mooncake"
        finally:
            mlc.close()


def test_no_master_is_one_clear_error_at_once():
    config = MooncakeConfig(f"127.0.0.1:{free_port()}", "P2PHANDSHAKE", segment_bytes=0, hostname="127.0.0.1")
    started = time.monotonic()
    with pytest.raises(TierUnreachable, match="no Mooncake master answers"):
        MooncakeTier(1 << 20, config)
    assert time.monotonic() - started < 30, "the client's own setup would retry for about 90 s"


def test_sdcp_fast_mlc_builds_the_mooncake_tier_from_its_options():
    from sdcp_fast.cli import mlc as cli

    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    config = cli._mooncake(parser.parse_args(["--mooncake-master", "10.0.0.2:50051", "--mooncake-replicas", "3"]))
    assert (config.master, config.metadata, config.replicas, config.segment_bytes) == (
        "10.0.0.2:50051", "http://10.0.0.2:8080/metadata", 3, 512 << 20)
    assert cli._mooncake(parser.parse_args([])) is None
    both = parser.parse_args(["--insecure", "--redis", "redis://127.0.0.1:1/0", "--mooncake-master", "127.0.0.1:1"])
    assert cli.run(both) == 2


def test_sdcp_fast_mlc_without_its_master_says_so_in_one_line(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "sdcp_fast", "mlc", "--insecure", "--port", "0", "--root",
                           str(tmp_path), "--mooncake-master", f"127.0.0.1:{free_port()}"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("sdcp-fast mlc: no Mooncake master answers at 127.0.0.1:")


def test_a_put_bound_for_the_networked_tier_is_not_run_inline(clock):
    """The MLC server runs a put that the host tier keeps as it came on its event loop; one
    that goes over the network to the store must go to a worker thread instead."""

    class Networked(HostTier):
        outlives_host = True

    mlc = MLC([HostTier(1 << 20), Networked(1 << 20, name="networked")], clock=clock)
    try:
        data = bytes(64)
        assert mlc.stores_as_is(data, len(data), uri("draft_kv", 1)) == mlc.tiers[0].adopts_bytes
        assert not mlc.stores_as_is(data, len(data), uri("target_kv", 1))
        assert mlc.put(uri("target_kv", 1), data).tier == "networked"
    finally:
        mlc.close()


def test_sdcp_fast_mlc_serves_what_a_takeover_reads_from_mooncake(master, tmp_path):
    from sdcp_fast.cache.http_client import RemoteMLC

    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "sdcp_fast", "mlc", "--insecure", "--port", str(port), "--root", str(tmp_path),
         "--host-mib", "16", "--disk-mib", "16", "--mooncake-master", master.address, "--mooncake-metadata",
         master.metadata, "--mooncake-segment-mib", "16", "--mooncake-hostname", "127.0.0.1"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout is not None
        assert f"serving http://127.0.0.1:{port}" in proc.stdout.readline()  # EOF if it exits instead
        with RemoteMLC(f"http://127.0.0.1:{port}") as mlc:
            mlc.put(uri("target_kv", 30), blob(30))
            assert mlc.head(uri("target_kv", 30)).tier == "mooncake"
            assert bytes(mlc.get(uri("target_kv", 30))) == blob(30)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
    assert proc.returncode == 0


def placed_in_mooncake(put: Callable[[str, bytes], object]) -> Callable[[], bool | None]:
    """A check for ``until``: True once a new target_kv put lands in the store."""
    fresh = itertools.count(100)

    def check() -> bool | None:
        n = next(fresh)
        return getattr(put(uri("target_kv", n), blob(n % 256)), "tier", None) == "mooncake" or None

    return check


def test_a_tier_built_before_its_master_serves_without_it_then_attaches(clock, monkeypatch):
    """With attach_later and no master the tier answers TierUnreachable at once and the MLC
    keeps objects on this host; once a master listens where it was told, puts land in the store."""
    monkeypatch.setattr(mooncake, "RETRY_AFTER_S", 0.5)
    rpc, meta = free_port(), free_port()
    config = MooncakeConfig(f"127.0.0.1:{rpc}", f"http://127.0.0.1:{meta}/metadata", segment_bytes=16 << 20,
                            buffer_bytes=8 << 20, hostname="127.0.0.1", attach_later=True)
    started = time.monotonic()
    tier = MooncakeTier(1 << 20, config, prefix="t9:")
    mlc = MLC([HostTier(1 << 20), tier], clock=clock)
    try:
        assert time.monotonic() - started < 30, "the client's own setup would retry for about 90 s"
        with pytest.raises(TierUnreachable):
            tier.probe("anything")
        assert mlc.put(uri("target_kv", 1), blob(1)).tier == "host", "this host keeps it instead"
        assert bytes(mlc.get(uri("target_kv", 1))) == blob(1)
        mlc.delete(uri("target_kv", 1))
        with running_master(ports=(rpc, meta)) as m:
            until(placed_in_mooncake(mlc.put), "a put landing in the store once the master answers")
            other = MooncakeTier(1 << 20, m.config(segment_bytes=0), prefix="t9:")
            try:
                assert other.probe(uri("target_kv", 100)) == 2048, "another node reads what it put"
            finally:
                other.close()
            mlc.close()
    finally:
        mlc.close()


def test_a_tier_with_attach_later_and_its_master_up_attaches_at_once(master):
    tier = MooncakeTier(1 << 20, master.config(attach_later=True), prefix="t10:")
    try:
        assert bytes(tier.read(tier.write("x", blob(3)))) == blob(3)
    finally:
        tier.close()


def test_sdcp_fast_mlc_with_attach_later_serves_without_its_master_then_attaches(tmp_path):
    from sdcp_fast.cache.http_client import RemoteMLC

    port, rpc, meta = free_port(), free_port(), free_port()
    log = tmp_path / "mlc.err"
    with log.open("w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "sdcp_fast", "mlc", "--insecure", "--port", str(port), "--root",
             str(tmp_path / "root"), "--host-mib", "16", "--disk-mib", "16", "--mooncake-master", f"127.0.0.1:{rpc}",
             "--mooncake-metadata", f"http://127.0.0.1:{meta}/metadata", "--mooncake-segment-mib", "16",
             "--mooncake-hostname", "127.0.0.1", "--mooncake-attach-later"],
            stdout=subprocess.PIPE, stderr=err, text=True)
    try:
        assert proc.stdout is not None
        assert f"serving http://127.0.0.1:{port}" in proc.stdout.readline(), log.read_text()  # EOF if it exits
        assert "serving without the tier" in log.read_text()
        with RemoteMLC(f"http://127.0.0.1:{port}") as mlc:
            assert mlc.put(uri("target_kv", 1), blob(1)).tier == "host"
            with running_master(ports=(rpc, meta)):
                until(placed_in_mooncake(mlc.put), "a put landing in the store once the master answers", 60)
                assert "attached to the master" in log.read_text()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
    assert proc.returncode == 0, log.read_text()
