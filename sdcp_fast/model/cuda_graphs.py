"""CUDA graphs of the runner's paged passes (decode: one row per session; verify: M + 1).

As gpt-fast and vLLM do: a pass of fixed shapes is captured once and replayed, so a step
costs one graph launch instead of hundreds of kernel launches from Python. A graph is
captured per (batch bucket, rows per session, block-table width, cache storage): the batch
is padded up to its bucket with sessions that write nothing (:meth:`BatchLayout.pack`), the
table up to a power of two. The step's inputs travel in one int64 tensor, copied from
page-locked memory into the graph's static buffer without blocking the host; the output
rows are copied out of the graph's buffer, so nothing on the path waits for the device.
Only batches whose sessions all bring the same number of rows, each of them an output row,
replay a graph; the runner runs the others (prefills, ragged rounds) eagerly.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from .batch_layout import BatchLayout
from .kv_cache import PagedKVCache
from .llama import Transformer

# Batch buckets, as vLLM's capture sizes: 1, 2, 4, 8, then steps of 8 to 32, of 16 to 128,
# of 32 to 256.
DEFAULT_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 80, 96, 112, 128, 160, 192, 224, 256)


def bucket_for(batch: int, buckets: tuple[int, ...]) -> int | None:
    """The smallest bucket holding ``batch`` sessions, None past the largest."""
    return next((b for b in buckets if b >= batch), None)


def width_for(blocks: int) -> int:
    """Table width of a graph: the next power of two (a new capture only when a session's
    blocks cross one)."""
    return 1 << max(0, blocks - 1).bit_length()


# Turns a step into (replay, output buffer): a CUDA graph here; tests on CPU pass one that
# runs the step again and copies its result into the buffer.
Capture = Callable[[Callable[[], torch.Tensor]], tuple[Callable[[], object], torch.Tensor]]


@dataclass
class _Graph:
    replay: Callable[[], object]
    meta: torch.Tensor  # the static input: BatchLayout.pack's tensor on the device
    out: torch.Tensor  # [batch * rows, V] float32 logits, the graph's output buffer


class GraphBank:
    """Captured paged passes of one runner (``model``'s first ``n_layers`` over ``cache``)."""

    def __init__(self, model: Transformer, cache: PagedKVCache, n_layers: int,
                 buckets: tuple[int, ...] = DEFAULT_BUCKETS, max_rows: int = 16, attention: str = "triton",
                 capture: Capture | None = None) -> None:
        if capture is None and cache.device.type != "cuda":
            raise ValueError("CUDA graphs need the model on a CUDA device")
        self.model, self.cache, self.n_layers, self.attention = model, cache, n_layers, attention
        self.buckets, self.max_rows = tuple(sorted(buckets)), max_rows
        self.graphs: dict[tuple[int, int, int], _Graph] = {}
        self.pool: Any = None  # one memory pool shared by every graph
        self._storage: tuple[int, ...] = ()
        self._capture_step = capture or self._cuda_capture
        self.captures = 0

    def fits(self, sessions: list[bytes], new: list[list[int]], n_out: list[int]) -> bool:
        """Whether this batch can replay a graph: every session brings ``rows`` tokens, all
        of them output rows, and the batch fits a bucket."""
        rows = len(new[0])
        return (0 < rows <= self.max_rows and all(len(t) == rows for t in new) and all(k == rows for k in n_out)
                and bucket_for(len(sessions), self.buckets) is not None)

    def run(self, sessions: list[bytes], new: list[list[int]]) -> torch.Tensor:
        """Reserve the new tokens' slots, replay (capturing first if needed); ``[T, V]`` logits."""
        rows, batch = len(new[0]), len(sessions)
        padded = bucket_for(batch, self.buckets)
        assert padded is not None
        bs = self.cache.block_size
        need = max(-(-(len(self.cache.seq(s).tokens) + rows) // bs) for s in sessions)  # blocks after this pass
        width = width_for(need)
        host, _ = BatchLayout.pack(self.cache, sessions, new, batch=padded, width=width)
        storage = tuple(t.data_ptr() for t in (*self.cache.k, *self.cache.v))
        if storage != self._storage:  # the pool grew: the captured graphs point at freed storage
            self.graphs.clear()
            self._storage = storage
        key = (padded, rows, width)
        g = self.graphs.get(key)
        if g is None:
            g = self.graphs[key] = self._capture(host, padded * rows, padded, width)
        g.meta.copy_(host.pin_memory() if g.meta.is_cuda else host, non_blocking=True)
        g.replay()
        return g.out[: batch * rows].clone()

    def _step(self, meta: torch.Tensor, rows: int, batch: int, width: int) -> Callable[[], torch.Tensor]:
        tokens, lay = BatchLayout.paged(meta, [], rows, batch, width, attention=self.attention)

        def step() -> torch.Tensor:
            hidden = self.model.forward(tokens, self.cache, lay, n_layers=self.n_layers)  # [T, dim]
            return self.model.logits(hidden)  # [T, V]

        return step

    def _capture(self, host: torch.Tensor, rows: int, batch: int, width: int) -> _Graph:
        meta = host.to(self.cache.device)
        replay, out = self._capture_step(self._step(meta, rows, batch, width))
        self.captures += 1
        return _Graph(replay, meta, out)

    def _cuda_capture(self, step: Callable[[], torch.Tensor]) -> tuple[Callable[[], object], torch.Tensor]:
        # Warm-up off the capture (triton compiles here, the allocator settles); it writes
        # the same K and V the replay will write, so it changes nothing.
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
            out = step()
        self.pool = graph.pool()
        return graph.replay, out
