"""What every MLC tier implements. Tiers are dumb storage: the MLC's index decides what goes
where (capacity, LRU, leases); a tier only writes, reads and drops the bytes behind a handle."""

from __future__ import annotations

from typing import Any, Protocol

from sdcp_fast.protocol.problems import SdcpProblem


class TierUnreachable(SdcpProblem, ConnectionError):
    """A networked tier did not answer (its server or master is down or cut off)."""

    suffix = "mlc-tier-unreachable"
    status = 503
    title = "The cache's networked tier is unreachable"


class Tier(Protocol):
    name: str
    capacity: int
    # False for device memory: bytes must be copied out before Python can read them.
    host_readable: bool

    def write(self, key: str, data: Any) -> Any:
        """Store ``data`` (a contiguous buffer or torch tensor); return a handle."""
        ...

    def read(self, handle: Any) -> memoryview:
        """All bytes; a view of the stored buffer where the tier can give one (no copy)."""
        ...

    def read_range(self, handle: Any, start: int, stop: int) -> memoryview:
        ...

    def drop(self, handle: Any) -> None:
        ...

    def close(self) -> None:
        ...


def as_bytes_view(data: Any) -> memoryview:
    """A flat read-only byte view of a buffer or CPU tensor (no copy)."""
    if hasattr(data, "untyped_storage"):  # torch.Tensor without importing torch here
        t = data.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        t = t.contiguous().reshape(-1).view(__import__("torch").uint8)
        return memoryview(t.numpy()).toreadonly()
    mv = memoryview(data)
    if not mv.contiguous:
        raise ValueError("object data must be a contiguous buffer")
    return mv.cast("B") if mv.format != "B" or mv.ndim != 1 else mv
