"""A put that cannot fit the disk tier's file system is refused (507 ``mlc-full``) before
anything is evicted: what the tier held stays readable. Run on a tmpfs smaller than the tier
(in a private mount namespace where the machine allows one), and with the same limit imposed
on the tier in process."""

from __future__ import annotations

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

from .test_disk_full import _SmallFs

FS_BYTES = 2 << 20
TIER_BYTES = 8 << 20  # the tier claims more than the file system has
OBJECT = 64 << 10
HELD = 20
ROOT = Path(__file__).resolve().parents[2]


def _uri(n: int) -> str:
    return object_uri(bytes(16), b"disk-refusal-ses", "q_rows", n)


def scenario(root: str) -> dict[str, Any]:
    with MLC([HostTier(OBJECT), DiskTier(TIER_BYTES, root)]) as mlc:
        body = {n: bytes([n]) * OBJECT for n in range(HELD)}
        for n in range(HELD):
            mlc.put(_uri(n), body[n])
        before = [n for n in range(HELD) if mlc.contains(_uri(n))]
        refused = 0
        for size in (3 * FS_BYTES // 2, 3 * FS_BYTES // 2 + 1):  # bigger than the file system, not than the tier
            try:
                mlc.put(_uri(1000 + size), b"x" * size)
            except CacheFull as exc:
                refused += exc.status == 507
        after = [n for n in range(HELD) if mlc.contains(_uri(n)) and bytes(mlc.get(_uri(n))) == body[n]]
        fits = mlc.put(_uri(2000), b"y" * OBJECT).tier  # what fits is still stored
        return dict(before=len(before), after=len(after), refused=refused, fits=fits)


class _StatFs(_SmallFs):
    """The small file system, with ``statvfs`` telling its free space as a tmpfs would."""

    def statvfs(self, path: Any) -> Any:
        real = os.statvfs(path)
        free = max(0, self._limit - self._used()) // 4096

        class Vfs:
            f_frsize = 4096
            f_bsize = 4096
            f_bavail = free
            f_bfree = free
            f_blocks = self._limit // 4096
            f_files = real.f_files

        return Vfs()


def _check(figures: dict[str, Any]) -> None:
    assert figures["before"] == HELD
    assert figures["refused"] == 2
    assert figures["after"] == HELD, f"the refused put evicted {HELD - figures['after']} of {HELD} objects"
    assert figures["fits"] in ("host", "disk")


def test_a_put_bigger_than_the_free_space_evicts_nothing_in_process(tmp_path, monkeypatch):
    root = str(tmp_path / "small")
    os.makedirs(os.path.join(root, "objects"))
    monkeypatch.setattr(disk, "os", _StatFs(os.path.join(root, "objects"), FS_BYTES))
    _check(scenario(root))


def test_a_put_bigger_than_the_free_space_evicts_nothing_on_a_tmpfs(tmp_path):
    unshare = shutil.which("unshare")
    if unshare is None or not sys.platform.startswith("linux"):
        pytest.skip("no unshare here to mount a private tmpfs (the in-process limit runs instead)")
    mnt = tmp_path / "tmpfs"
    mnt.mkdir()
    script = (f"mount -t tmpfs -o size={FS_BYTES} tmpfs {mnt} || exit 77; "
              f"exec {sys.executable} -m tests.faults.test_disk_full_refusal {mnt}")
    proc = subprocess.run([unshare, "-rm", "sh", "-c", script], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    if proc.returncode != 0 and "Traceback" not in proc.stderr:
        pytest.skip(f"no private mount namespace for a tmpfs here: {proc.stderr.strip()[-200:]}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    _check(json.loads(proc.stdout.strip().splitlines()[-1]))


if __name__ == "__main__":
    print(json.dumps(scenario(sys.argv[1])))
