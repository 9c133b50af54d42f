"""Measured load for status reports (§5.2 ``status``) and verdicts (§6.5).

Nothing here is synthesized: a drafter reports the share of recent wall time it spent
drafting and the sessions waiting for it; a verifier the occupancy of its recent batches and
its queue, and, where a GPU and NVML (``nvidia-ml-py``) are present, the GPU's utilization
and memory use, whichever is highest.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any


class BusyMeter:
    """Share of wall time spent inside :meth:`busy` spans, as an exponentially decayed
    average with time constant ``window`` seconds."""

    def __init__(self, window: float = 2.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.window = window
        self.clock = clock
        self._share = 0.0
        self._since = clock()

    def add(self, start: float, end: float) -> None:
        """A busy span [start, end] that just finished."""
        now = max(end, self._since)
        elapsed = max(now - self._since, 1e-9)
        busy = min(max(end - start, 0.0), elapsed)
        decay = math.pow(0.5, elapsed / self.window)
        self._share = decay * self._share + (1.0 - decay) * (busy / elapsed)
        self._since = now

    def percent(self) -> int:
        idle = max(self.clock() - self._since, 0.0)
        return max(0, min(100, round(100 * self._share * math.pow(0.5, idle / self.window))))


class Gpu:
    """GPU utilization and memory in percent through NVML, or nothing when unavailable."""

    def __init__(self) -> None:
        self._handle: Any = None
        self._nvml: Any = None
        self.why: str = ""
        try:
            import torch

            if not torch.cuda.is_available():
                self.why = "no CUDA device"
                return
            import pynvml

            pynvml.nvmlInit()
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
            self._nvml = pynvml
        except Exception as exc:  # no driver, no package: load stays what the queues say
            self.why = f"NVML unavailable: {exc}"

    def percent(self) -> int:
        if self._handle is None:
            return 0
        try:
            util = self._nvml.nvmlDeviceGetUtilizationRates(self._handle).gpu
            mem = self._nvml.nvmlDeviceGetMemoryInfo(self._handle)
            return max(0, min(100, max(int(util), round(100 * int(mem.used) / max(1, int(mem.total))))))
        except Exception:
            return 0


class VerifierLoad:
    """Batch occupancy (sessions per pass / ``max_batch``), decayed over recent passes,
    the queue, and the GPU where measurable."""

    def __init__(self, max_batch: int, gpu: Gpu | None = None) -> None:
        self.max_batch = max_batch
        self.gpu = gpu if gpu is not None else Gpu()
        self._occupancy = 0.0
        self._running = 0.0  # the work of the pass in progress
        self.queue = 0
        self.prefill = 0  # prompt tokens still waiting for their prefill chunks

    def batch(self, size: int, fed: int = 0) -> None:
        """A pass of ``size`` rounds starts, feeding ``fed`` tokens to the model. A prefill is
        work too: a full batch of decoding rounds feeds about ``max_batch * 9`` tokens (M = 8
        and the bonus), so a pass feeding that many counts as full, however few its rounds. It
        counts while it runs (a long prefill shows at once), then in the decayed average."""
        work = min(1.0, max(size / self.max_batch, fed / (self.max_batch * 9)))
        self._occupancy = 0.7 * self._occupancy + 0.3 * work
        self._running = work

    def done(self) -> None:
        """The pass started by :meth:`batch` ended."""
        self._running = 0.0

    def percent(self) -> int:
        # A prompt fed in chunks is work waiting like queued rounds: as many full passes as its
        # tokens fill (each chunk's pass alone feeds only a part of one).
        queued = min(1.0, max(self.queue / self.max_batch, self.prefill / (self.max_batch * 9)))
        return max(round(100 * max(self._occupancy, queued, self._running)), self.gpu.percent())
