"""The host tier with a part in shared memory (sdcp_fast/cache/tiers/shm.py): other objects are
kept as the host tier keeps them, and what dead writers and dead nodes leave is removed."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from sdcp_fast.cache import MLC
from sdcp_fast.cache.tiers.shm import FOLDER_PREFIX, HEADER, ORPHAN_AGE, ShmTier, ShmUpload, attach


def upload(tier: ShmTier, token: str, data: bytes) -> ShmUpload:
    with open(os.path.join(tier.folder, "up-" + token), "wb") as f:
        f.seek(HEADER)
        f.write(data)
    return ShmUpload.open(tier.folder, token)


def test_buffers_of_network_puts_are_pooled_as_in_the_host_tier(tmp_path):
    tier = ShmTier(1 << 20, base=str(tmp_path))
    try:
        tier.drop(tier.write("k", bytearray(100)))
        assert tier._pooled == 100  # nobody views it: reused
        held = [tier.write("k", bytearray(200))]
        view = tier.read(held[0])
        tier.drop(held.pop())
        assert tier._pooled == 100 and view.nbytes == 200  # a reader views it: never reused
    finally:
        tier.close()
    assert not os.path.exists(tier.folder)


def test_a_slot_is_kept_until_the_index_drops_it(tmp_path, clock):
    tier = ShmTier(1 << 20, base=str(tmp_path))
    with MLC([tier], clock=clock) as mlc:
        mlc.put("mlc://s/a/q_rows/1", upload(tier, "a" * 32, b"\5" * 5000), lease_ttl=1.0)
        assert bytes(mlc.get("mlc://s/a/q_rows/1")) == b"\5" * 5000
        assert sorted(os.listdir(tier.folder)) == ["node.id", "slot-1"]
        clock.advance(1.5)
        assert not mlc.contains("mlc://s/a/q_rows/1")
        assert os.listdir(tier.folder) == ["node.id"]


def test_uploads_never_put_and_folders_of_dead_nodes_are_removed(tmp_path):
    tier = ShmTier(1 << 20, base=str(tmp_path))
    try:
        stale = os.path.join(tier.folder, "up-" + "b" * 32)
        with open(stale, "wb") as f:
            f.write(b"\0" * (HEADER + 1))
        old = time.time() - 2 * ORPHAN_AGE
        os.utime(stale, (old, old))
        tier._swept -= ORPHAN_AGE  # the sweep is due
        tier.write("mlc://s/a/q_rows/1", upload(tier, "c" * 32, b"\1" * 10))
        assert not os.path.exists(stale)
    finally:
        tier.close()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    left = tmp_path / (FOLDER_PREFIX + "left")
    left.mkdir()
    (left / "node.id").write_text(f"{'d' * 32} {dead.stdout.strip()}\n")
    alive = ShmTier(1 << 20, base=str(tmp_path))
    try:
        assert not left.exists() and attach(alive.folder, alive.token) and not attach(alive.folder, "d" * 32)
    finally:
        alive.close()


def test_a_freed_slot_leaves_the_name_its_object_was_put_again_under(tmp_path):
    tier = ShmTier(1 << 20, base=str(tmp_path))
    try:
        old = tier.write("mlc://s/a/q_rows/1", upload(tier, "d" * 32, b"\1" * 10))
        new = tier.write("mlc://s/a/q_rows/1", upload(tier, "e" * 32, b"\2" * 10))
        tier.drop(old)
        (name,) = os.listdir(tier.names)
        with open(os.path.join(tier.names, name), "rb") as f:
            assert f.read()[HEADER:] == b"\2" * 10
        tier.drop(new)
        assert os.listdir(tier.names) == []
    finally:
        tier.close()
    assert not os.path.exists(tier.names)


def test_the_names_folder_of_a_dead_node_is_removed_with_its_folder(tmp_path):
    tier = ShmTier(1 << 20, base=str(tmp_path))
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    with open(os.path.join(tier.folder, "node.id"), "w") as f:
        f.write(f"{tier.token} {dead.stdout.strip()}\n")
    ShmTier(1 << 20, base=str(tmp_path)).close()
    assert not os.path.exists(tier.folder) and not os.path.exists(tier.names)


def test_kept_files_of_dead_writers_are_removed(tmp_path):
    tier = ShmTier(1 << 20, base=str(tmp_path))
    try:
        dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True).stdout.strip()
        theirs = os.path.join(tier.folder, f"w-{dead}-{'a' * 32}")
        mine = os.path.join(tier.folder, f"w-{os.getpid()}-{'b' * 32}")
        for path in (theirs, mine):
            with open(path, "wb") as f:
                f.write(b"\0" * (HEADER + 1))
        tier._swept -= ORPHAN_AGE  # the sweep is due
        tier.write("mlc://s/a/q_rows/1", upload(tier, "c" * 32, b"\1" * 10))
        assert not os.path.exists(theirs) and os.path.exists(mine)
    finally:
        tier.close()
