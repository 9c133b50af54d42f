"""Host memory tier: page-locked buffers so device copies need no pageable staging.

Where CUDA exists the buffers come from torch's pinned allocator (registered with the
driver); otherwise from the C++ extension (mmap + mlock); without either, from
bytearray (pageable), and ``pinned`` says so.

A native buffer is its own mapping of whole pages, so objects under ``SMALL_OBJECT`` bytes
(q rows, committed tokens) are kept in ordinary memory instead: a 200-byte object would
otherwise cost a 4 KiB page and one of the process's ``vm.max_map_count`` mappings (65,530 by
default), and puts failed with ``MemoryError`` once ~65,000 small objects were held, far
below ``max_objects``. Should the mappings still run out, the buffer is pageable rather than
the put refused.

Without CUDA, an object given as ``bytes`` (immutable: nobody can write it after the put) is
kept as it is, with no copy: the MLC server hands over a request body so, and a q-rows put
then costs no 512 KB copy and no buffer. With CUDA, objects are copied into pinned buffers,
which device copies need.
"""

from __future__ import annotations

import os
import sys
import warnings
from typing import Any

from sdcp_fast import native
from sdcp_fast.cache.tiers.tier import as_bytes_view

# Below this, page-locking buys little (a copy of a few pages is staged by the driver anyway)
# and costs a mapping each; at 64 KiB a full 1 GiB tier holds at most 16,384 mappings.
SMALL_OBJECT = 64 << 10


class _RefProbe:
    def drop(self, handle: Any) -> int:
        return sys.getrefcount(handle)


# References to a handle passed as a temporary into a method, on this interpreter (3.11
# steals the caller's stack reference, older versions keep it): anything above is a reader.
_UNSHARED_REFS = _RefProbe().drop(object())


def _cuda() -> bool:
    # Importing torch costs seconds; a machine without an NVIDIA driver node cannot have CUDA.
    if "torch" not in sys.modules and not os.path.exists("/dev/nvidiactl"):
        return False
    try:
        import torch

        return bool(torch.cuda.is_available())
    except ImportError:
        return False


class HostTier:
    host_readable = True

    def __init__(self, capacity: int, *, name: str = "host", pool_bytes: int | None = None) -> None:
        self.name = name
        self.capacity = capacity
        self._torch_pinned = _cuda()
        self._native = None if self._torch_pinned or not native.available() else native.module()
        self.allocator = "torch-pinned" if self._torch_pinned else ("native-mlock" if self._native else "bytearray")
        # Freed buffers are kept by exact size and reused: a fresh pinned allocation costs a
        # page fault per 4 KiB (and mlock), which would dominate puts of equal-sized q rows.
        self._pool: dict[int, list[Any]] = {}
        self._pool_limit = capacity // 4 if pool_bytes is None else pool_bytes
        self._pooled = 0

    @property
    def pinned(self) -> bool:
        return self.allocator != "bytearray"

    def _alloc(self, n: int) -> Any:
        free = self._pool.get(n)
        if free:
            self._pooled -= n
            buf = free.pop()
            if not free:
                del self._pool[n]
            return buf
        if self._torch_pinned:
            import torch

            return torch.empty(n, dtype=torch.uint8, pin_memory=True)
        if self._native is not None and n >= SMALL_OBJECT:
            try:
                return self._native.HostBuffer(n)
            except MemoryError:
                pass  # out of mappings or locked memory: pageable memory still holds the object
        return bytearray(n)

    def _view(self, buf: Any) -> memoryview:
        if self._torch_pinned:
            return memoryview(buf.numpy())
        return memoryview(buf)

    @property
    def adopts_bytes(self) -> bool:
        """Whether :meth:`write` keeps a ``bytes`` object as it is (no copy)."""
        return not self._torch_pinned

    def write(self, key: str, data: Any) -> Any:
        if type(data) is bytes and not self._torch_pinned:
            return data  # immutable: stored as it is
        if self._torch_pinned and hasattr(data, "untyped_storage") and data.device.type == "cuda":
            buf = self._alloc(data.numel() * data.element_size())
            from sdcp_fast.cache.tiers.device import copy_async

            copy_async(buf, data)
            return buf
        src = as_bytes_view(data)
        buf = self._alloc(src.nbytes)
        if src.nbytes:
            if self._native is not None:
                self._native.host_copy(buf, src)
            else:
                self._view(buf)[:] = src
        return buf

    def read(self, handle: Any) -> memoryview:
        return self._view(handle).toreadonly()

    def read_range(self, handle: Any, start: int, stop: int) -> memoryview:
        return self._view(handle)[start:stop].toreadonly()

    def read_into(self, handle: Any, out: memoryview) -> int:
        n = len(handle)
        if self._native is not None:
            self._native.host_copy(out, handle)
        else:
            out[:n] = self._view(handle)
        return n

    def tensor(self, handle: Any) -> Any:
        """The stored bytes as a CPU uint8 tensor (pinned where CUDA exists), no copy."""
        import torch

        if self._torch_pinned:
            return handle
        if not len(handle):
            return torch.empty(0, dtype=torch.uint8)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # bytes kept as they came: read-only, as documented
            return torch.frombuffer(handle, dtype=torch.uint8)

    def drop(self, handle: Any) -> None:
        # A buffer still exported to a reader (a memoryview from get) must not be reused:
        # the reader would see the next object's bytes. Callers pass the handle as a
        # temporary so that only this frame holds it.
        n = len(handle)
        if not n or n > self._pool_limit or type(handle) is bytes or sys.getrefcount(handle) > _UNSHARED_REFS:
            return  # bytes kept as they came are nobody's to reuse
        while self._pooled + n > self._pool_limit:  # oldest size class first
            size = next(iter(self._pool))
            self._pool[size].pop()
            self._pooled -= size
            if not self._pool[size]:
                del self._pool[size]
        self._pool.setdefault(n, []).append(handle)
        self._pooled += n

    def close(self) -> None:
        self._pool.clear()
        self._pooled = 0
