"""Local disk tier: one file per object, read back through mmap (no copy into Python).

Device tensors go straight to and from disk through NVIDIA GDS (cuFile, via kvikio) when
kvikio and a GPU are present; everything else takes the host path.
"""

from __future__ import annotations

import mmap
import os
import shutil
import tempfile
from typing import Any

from sdcp_fast.cache.tiers.tier import as_bytes_view

_EMPTY = memoryview(b"")
_POPULATE = getattr(mmap, "MAP_POPULATE", 0)
# Below this size one pread (a copy) costs less than setting up and faulting in a mapping
# (measured with bench/mlc.py). Callers with a buffer of their own use read_into instead.
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
        self._objects = os.path.join(self.root, "objects")
        self._gds = _kvikio()
        self.gds = self._gds is not None
        self._seq = 0

    def free_space(self) -> int:
        """Bytes the file system under the tier can still take (what an unprivileged writer
        may use); the tier's capacity may claim more than that."""
        st = os.statvfs(self._objects)
        return int(st.f_bavail * st.f_frsize)

    def _path(self, key: str) -> str:
        # Named by sequence, not by key: a re-put never truncates a file a reader still has
        # mapped, and names need no escaping.
        self._seq += 1
        return f"{self._objects}/{self._seq:x}"

    def write(self, key: str, data: Any) -> str:
        """Write a new file; a write that fails (a full file system: ``ENOSPC``) leaves no
        partial file behind, so the folder never holds more than the index accounts for."""
        path = self._path(key)
        try:
            if self._gds is not None and hasattr(data, "untyped_storage") and data.device.type == "cuda":
                with self._gds.CuFile(path, "w") as f:
                    f.write(data.contiguous())
                return path
            view = as_bytes_view(data)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                done = 0
                while done < view.nbytes:
                    done += os.write(fd, view[done:])
            finally:
                os.close(fd)
        except BaseException:
            self.drop(path)
            raise
        return path

    def _map(self, path: str) -> memoryview:
        fd = os.open(path, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            if size == 0:
                return _EMPTY
            if size < MAP_FROM:
                return memoryview(os.pread(fd, size, 0))
            # The mapping outlives the descriptor and is unmapped when the last view goes.
            # MAP_POPULATE faults every page in at once instead of one fault per 4 KiB read.
            return memoryview(mmap.mmap(fd, 0, flags=mmap.MAP_SHARED | _POPULATE, prot=mmap.PROT_READ))
        finally:
            os.close(fd)

    def read(self, handle: str) -> memoryview:
        return self._map(handle)

    def read_range(self, handle: str, start: int, stop: int) -> memoryview:
        if stop - start < MAP_FROM:
            fd = os.open(handle, os.O_RDONLY)
            try:
                return memoryview(os.pread(fd, stop - start, start))
            finally:
                os.close(fd)
        return self._map(handle)[start:stop]

    def read_into(self, handle: str, out: memoryview) -> int:
        """Read the whole object into ``out`` (a writable byte view at least that long)."""
        fd = os.open(handle, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            done = 0
            while done < size:
                n = os.preadv(fd, [out[done:size]], done)
                if n == 0:
                    raise OSError(f"{handle} shrank while being read")
                done += n
            return size
        finally:
            os.close(fd)

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
