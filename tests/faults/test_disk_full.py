"""The MLC on a disk smaller than its disk tier claims: a 256 KiB tmpfs (mounted in a private
mount namespace where the machine allows one) under a 4 MiB disk tier, else the same limit
imposed on the tier's writes in process.

Every put that fits a tier's accounting but not the file system evicts instead of failing;
an object bigger than the file system is 507 ``mlc-full``; a failed write leaves no partial
file, so after every object is deleted the folder is empty; what the index holds reads back.
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from sdcp_fast.cache import object_uri
from sdcp_fast.cache.failures import CacheFull
from sdcp_fast.cache.index import MLC
from sdcp_fast.cache.tiers import disk
from sdcp_fast.cache.tiers.disk import DiskTier
from sdcp_fast.cache.tiers.host import HostTier
from sdcp_fast.mlc_server.server import MLCService
from sdcp_fast.protocol.peer import Peer, PeerRole
from sdcp_fast.transport.base import Request

FS_BYTES = 256 << 10
OBJECT = 20 << 10
PUTS = 60
OWNER = Peer("https://127.0.0.1:8511/", PeerRole.DRAFTER)
ROOT = Path(__file__).resolve().parents[2]


def _uri(n: int) -> str:
    return object_uri(bytes(16), b"disk-full-sessio", "q_rows", n)


def _files(root: str) -> int:
    return len(os.listdir(os.path.join(root, "objects")))


def scenario(root: str) -> dict[str, Any]:
    """The whole run on ``root`` (a file system of ``FS_BYTES``); returns its figures."""
    out: dict[str, Any] = {}
    with MLC([HostTier(64 << 10), DiskTier(4 << 20, root)]) as mlc:
        body = {n: bytes([n]) * OBJECT for n in range(PUTS)}
        for n in range(PUTS):
            mlc.put(_uri(n), body[n])  # each demotes the host's oldest to the full disk
        held = [n for n in range(PUTS) if mlc.contains(_uri(n))]
        for n in held:  # a read promotes: the swap may again meet the full disk
            if mlc.contains(_uri(n)):
                assert bytes(mlc.get(_uri(n))) == body[n]
        stats = mlc.stats()
        assert _files(root) == stats["tiers"][1]["objects"], "no file the index does not know"
        out.update(puts=PUTS, held=len(held), evictions=sum(s.get("evictions", 0) for s in _scopes(stats)))

        service = MLCService(mlc)
        big = Request("PUT", f"objects/{_uri(1000).removeprefix('mlc://')}", body=b"x" * (300 << 10), peer=OWNER,
                      headers={"content-type": "application/octet-stream"})
        answer = asyncio.run(service.handler(big))
        assert answer.status == 507, (answer.status, answer.body[:300])
        assert json.loads(answer.body)["type"].endswith("mlc-full")
        try:
            mlc.put(_uri(1001), b"y" * (300 << 10))
        except CacheFull as exc:
            assert exc.status == 507
        else:
            raise AssertionError("an object bigger than the file system was stored")
        assert _files(root) == mlc.stats()["tiers"][1]["objects"], "the failed writes left no partial file"

        for n in range(PUTS + 2000):
            if mlc.contains(_uri(n)):
                mlc.delete(_uri(n))
        assert mlc.stats()["tiers"][1]["used"] == 0
        out["files_after_delete"] = _files(root)
        assert out["files_after_delete"] == 0
    return out


def _scopes(stats: dict[str, Any]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for per_tier in stats["scopes"].values():
        rows.extend(per_tier.values() if isinstance(per_tier, dict) else [])
    return rows


class _SmallFs:
    """``os`` for the disk tier with writes failing ENOSPC past ``limit`` bytes in its folder
    (whole 4 KiB pages, as a tmpfs counts), after writing what fits."""

    def __init__(self, folder: str, limit: int) -> None:
        self._folder, self._limit = folder, limit

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)

    def _used(self) -> int:
        return sum(-(-e.stat().st_size // 4096) * 4096 for e in os.scandir(self._folder))

    def write(self, fd: int, data: Any) -> int:
        room = self._limit - self._used()
        n = min(len(data), max(0, room))
        if n == 0 and len(data):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return os.write(fd, data[:n])


def _tmpfs_run(tmp_path: Path) -> dict[str, Any] | None:
    unshare = shutil.which("unshare")
    if unshare is None or not sys.platform.startswith("linux"):
        return None
    mnt = tmp_path / "tmpfs"
    mnt.mkdir()
    script = (f"mount -t tmpfs -o size={FS_BYTES} tmpfs {mnt} || exit 77; "
              f"exec {sys.executable} -m tests.faults.test_disk_full {mnt}")
    proc = subprocess.run([unshare, "-rm", "sh", "-c", script], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    if proc.returncode in (77, 1) and "mount" in proc.stderr and "Traceback" not in proc.stderr:
        return None  # no private mounts here
    if proc.returncode != 0 and "unshare" in proc.stderr and "Traceback" not in proc.stderr:
        return None
    assert proc.returncode == 0, proc.stderr[-3000:]
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def test_on_a_tmpfs_smaller_than_the_tier(tmp_path):
    figures = _tmpfs_run(tmp_path)
    if figures is None:
        pytest.skip("no private mount namespace for a tmpfs here (the in-process limit below runs instead)")
    assert figures["held"] >= 3 and figures["files_after_delete"] == 0


def test_on_a_file_system_limit_imposed_in_process(tmp_path, monkeypatch):
    root = str(tmp_path / "small")
    os.makedirs(os.path.join(root, "objects"))
    monkeypatch.setattr(disk, "os", _SmallFs(os.path.join(root, "objects"), FS_BYTES))
    figures = scenario(root)
    assert figures["held"] >= 3 and figures["files_after_delete"] == 0


if __name__ == "__main__":
    print(json.dumps(scenario(sys.argv[1])))
