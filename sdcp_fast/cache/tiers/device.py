"""Device memory tier (CUDA tensors), present only with a GPU.

Copies between device and pinned host memory run on a side stream, so a verifier scoring
on the default stream overlaps with the MLC moving q rows; each copy is waited on through
its own event before the bytes are used or the source is released.
"""

from __future__ import annotations

import functools
from typing import Any

from sdcp_fast.cache.tiers.tier import as_bytes_view


@functools.cache
def _side_stream(device: str) -> Any:
    import torch

    return torch.cuda.Stream(device=device)  # type: ignore[no-untyped-call]


def copy_async(dst: Any, src: Any) -> None:
    """dst.copy_(src) on the side stream, then wait for it (both flat uint8 tensors)."""
    import torch

    dev = str(src.device if src.device.type == "cuda" else dst.device)
    stream = _side_stream(dev)
    stream.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(stream):
        dst.copy_(src.reshape(-1).view(torch.uint8), non_blocking=True)
        done = torch.cuda.Event()  # type: ignore[no-untyped-call]
        done.record(stream)
    done.synchronize()


class DeviceTier:
    host_readable = False

    def __init__(self, capacity: int, device: str = "cuda", *, name: str = "device") -> None:
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError("device tier needs CUDA: torch.cuda.is_available() is False")
        self.name = name
        self.capacity = capacity
        self.device = device

    def write(self, key: str, data: Any) -> Any:
        import torch

        if hasattr(data, "untyped_storage"):
            src = data.detach().contiguous().reshape(-1).view(torch.uint8)
        else:
            view = as_bytes_view(data)
            src = torch.frombuffer(view, dtype=torch.uint8) if view.nbytes else torch.empty(0, dtype=torch.uint8)
        out = torch.empty(src.numel(), dtype=torch.uint8, device=self.device)
        if src.numel():
            copy_async(out, src)
        return out

    def tensor(self, handle: Any) -> Any:
        return handle

    def empty(self, size: int) -> Any:
        import torch

        return torch.empty(size, dtype=torch.uint8, device=self.device)

    def read(self, handle: Any) -> memoryview:
        import torch

        host = torch.empty(handle.numel(), dtype=torch.uint8, pin_memory=True)
        if handle.numel():
            copy_async(host, handle)
        return host.numpy().data.toreadonly()

    def read_range(self, handle: Any, start: int, stop: int) -> memoryview:
        return self.read(handle[start:stop])

    def drop(self, handle: Any) -> None:
        del handle

    def close(self) -> None:
        pass
