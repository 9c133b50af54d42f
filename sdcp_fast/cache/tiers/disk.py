"""Local disk tier: one file per object, read back through mmap (no copy into Python).

Device tensors go straight to and from disk through NVIDIA GDS (cuFile, via kvikio) when
kvikio and a GPU are present; everything else takes the host path.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import shutil
import tempfile
from typing import Any

from sdcp_fast.cache.tiers.base import as_bytes_view

_EMPTY = memoryview(b"")
_POPULATE = getattr(mmap, "MAP_POPULATE", 0)
# Below this size one pread costs less than setting up (and tearing down) a mapping.
MAP_FROM = 1 << 20


def _kvikio() -> Any:
    try:
        import kvikio

        return kvikio
    except ImportError:
        return None


class DiskTier:
    host_readable = True

    def __init__(self, capacity: int, root: str | None = None, *, name: str = "disk") -> None:
        self.name = name
        self.capacity = capacity
        self._own = root is None
        self.root = root or tempfile.mkdtemp(prefix="sdcp-mlc-")
        # The index lives in memory, so object files of an earlier run are unreachable.
        shutil.rmtree(os.path.join(self.root, "objects"), ignore_errors=True)
        os.makedirs(os.path.join(self.root, "objects"), exist_ok=True)
        self._gds = _kvikio()
        self.gds = self._gds is not None
        self._seq = 0

    def _path(self, key: str) -> str:
        # A sequence number keeps a re-put from truncating a file a reader still has mapped.
        self._seq += 1
        digest = hashlib.blake2b(key.encode(), digest_size=12).hexdigest()
        return os.path.join(self.root, "objects", f"{digest}.{self._seq}")

    def write(self, key: str, data: Any) -> str:
        path = self._path(key)
        if self._gds is not None and hasattr(data, "untyped_storage") and data.device.type == "cuda":
            with self._gds.CuFile(path, "w") as f:
                f.write(data.contiguous())
            return path
        view = as_bytes_view(data)
        with open(path, "wb", buffering=0) as f:
            done = 0
            while done < view.nbytes:
                done += f.write(view[done:])
        return path

    def _map(self, path: str) -> memoryview:
        with open(path, "rb", buffering=0) as f:
            size = os.fstat(f.fileno()).st_size
            if size == 0:
                return _EMPTY
            if size < MAP_FROM:
                return memoryview(os.pread(f.fileno(), size, 0))
            # The mapping outlives the file object and is unmapped when the last view goes.
            # MAP_POPULATE faults every page in at once instead of one fault per 4 KiB read.
            return memoryview(mmap.mmap(f.fileno(), 0, flags=mmap.MAP_SHARED | _POPULATE, prot=mmap.PROT_READ))

    def read(self, handle: str) -> memoryview:
        return self._map(handle)

    def read_range(self, handle: str, start: int, stop: int) -> memoryview:
        if stop - start < mmap.PAGESIZE:
            with open(handle, "rb") as f:
                return memoryview(os.pread(f.fileno(), stop - start, start))
        return self._map(handle)[start:stop]

    def read_into_device(self, handle: str, out: Any) -> bool:
        """GDS read into a CUDA tensor; False when GDS is not there (caller goes via host)."""
        if self._gds is None:
            return False
        with self._gds.CuFile(handle, "r") as f:
            f.read(out)
        return True

    def drop(self, handle: str) -> None:
        try:
            os.unlink(handle)
        except FileNotFoundError:
            pass

    def close(self) -> None:
        if self._own:
            shutil.rmtree(self.root, ignore_errors=True)
