"""The target scorer: batched passes of the target over a paged KV cache (the verifier's
``TargetScorer``)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from sdcp_fast.model.interfaces import Logits, ScoreRequest

from .batch_layout import BatchLayout
from .cuda_graphs import DEFAULT_BUCKETS, GraphBank
from .kv_cache import PagedKVCache
from .llama import Transformer

ATTENTION = ("auto", "sdpa", "triton", "reference")


def _upload(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``host`` on ``device`` without blocking the host (from page-locked memory, which torch's
    caching host allocator keeps until the copy is done)."""
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


class ModelRunner:
    """Runs ``model`` (or its first ``n_layers`` layers) for many sessions at once.

    Every call receives each session's whole committed list and reconciles the cache
    against it (see :meth:`PagedKVCache.reconcile`): the longest cached prefix is kept,
    the rest is dropped by truncating the block table, and only the missing tokens are
    computed. Proposal tokens scored in a pass stay cached, so the accepted ones are not
    recomputed in the next round.

    ``attention``: ``"triton"`` reads K and V through the block table with the kernel
    library's ``paged_attention`` (on CPU tensors only under ``TRITON_INTERPRET=1``),
    ``"reference"`` with its torch reference, ``"sdpa"`` gathers each layer's cache and
    runs torch's SDPA; ``"auto"``: triton on CUDA where it imports, else sdpa.
    ``cuda_graphs`` (default: on for CUDA with triton attention) replays captured decode and
    verify passes (:mod:`.cuda_graphs`).
    """

    def __init__(self, model: Transformer, *, n_layers: int | None = None, block_size: int = 16,
                 num_blocks: int = 256, max_blocks: int | None = None, compile: bool = False,
                 attention: str = "auto", cuda_graphs: bool | None = None,
                 graph_buckets: tuple[int, ...] | None = None) -> None:
        self._n_layers, self._block_size, self._num_blocks = n_layers, block_size, num_blocks
        self._max_blocks, self._compile = max_blocks, compile
        self._attention, self._cuda_graphs, self._graph_buckets = attention, cuda_graphs, graph_buckets
        self._place(model)

    def _place(self, model: Transformer) -> None:
        """What depends on where ``model`` lives: an empty cache, the attention path, the
        compiled forward and the CUDA graphs, all on the model's device."""
        cfg = model.cfg
        self.model = model
        self.n_layers = self._n_layers or cfg.n_layers
        if not 1 <= self.n_layers <= cfg.n_layers:
            raise ValueError(f"n_layers must be in 1..{cfg.n_layers}")
        self.vocab_size = cfg.vocab_size
        dev = model.embed.weight.device
        self.cache = PagedKVCache(self.n_layers, cfg.n_kv_heads, cfg.head_dim, block_size=self._block_size,
                                  num_blocks=self._num_blocks, max_blocks=self._max_blocks,
                                  dtype=model.embed.weight.dtype, device=dev)
        self.attention = _attention(self._attention, dev)
        self._forward = torch.compile(model.forward, dynamic=True) if self._compile else model.forward
        self.passes = 0  # forward passes run (one per score / prefill / decode_one call)
        cuda_graphs = self._cuda_graphs
        if cuda_graphs is None:
            cuda_graphs = dev.type == "cuda" and self.attention == "triton" and not self._compile
        self.graphs: GraphBank | None = None
        if cuda_graphs:
            if dev.type != "cuda":
                raise ValueError(f"cuda_graphs needs the model on a CUDA device, not {dev}")
            if self.attention != "triton":
                raise ValueError("cuda_graphs needs attention='triton' (the gather + SDPA path has data-dependent shapes)")
            self.graphs = GraphBank(model, self.cache, self.n_layers, buckets=self._graph_buckets or DEFAULT_BUCKETS,
                                    attention=self.attention)

    @property
    def device(self) -> torch.device:
        return self.cache.device

    def to(self, device: torch.device | str) -> ModelRunner:
        """Move the model to ``device`` and start over there with the same options and an
        empty cache (cached sessions are dropped: the next call recomputes them)."""
        self._place(self.model.to(device))
        return self

    @torch.inference_mode()
    def _run(self, sessions: list[bytes], committed: list[Sequence[int]], extra: list[Sequence[int]],
             n_out: list[int]) -> list[torch.Tensor]:
        """Bring each session to ``committed + extra`` and return logits of its last
        ``n_out`` positions (``n_out <= len(extra) + 1``)."""
        if len(set(sessions)) != len(sessions):
            raise ValueError("a session appears twice in one batch")
        new: list[list[int]] = []
        for s, c, e in zip(sessions, committed, extra, strict=True):
            if len(c) < 1:
                raise ValueError("committed must hold at least one token")
            kept = self.cache.reconcile(s, c, keep_last=1)
            new.append([*c[kept:], *e])
        self.passes += 1
        if self.graphs is not None and self.graphs.fits(sessions, new, n_out):
            return Logits(self.graphs.run(sessions, new), n_out)
        # Only the rows asked for go through the (vocab-wide) head.
        ends = torch.tensor([len(t) for t in new]).cumsum(0).tolist()
        rows = [e - k + i for e, k in zip(ends, n_out, strict=True) for i in range(k)]
        if self.attention == "sdpa":
            lay = BatchLayout.build(self.cache, sessions, new)
            flat = torch.tensor([t for toks in new for t in toks], dtype=torch.int64, device=self.device)
            out_rows = torch.tensor(rows, dtype=torch.int64, device=self.device)
        else:  # one copy to the device, no host sync
            host, width = BatchLayout.pack(self.cache, sessions, new)
            total = ends[-1]
            meta = _upload(torch.cat([host, torch.tensor(rows, dtype=torch.int64)]), self.device)
            flat, lay = BatchLayout.paged(meta, sessions, total, len(sessions), width, self.attention)
            out_rows = meta[host.numel():]
        hidden = self._forward(flat, self.cache, lay, n_layers=self.n_layers)  # [T, dim]
        logits = self.model.logits(hidden[out_rows])  # [sum(n_out), V]
        return Logits(logits, n_out)  # views of one tensor, which the verifier reads whole

    def score(self, batch: Sequence[ScoreRequest]) -> list[torch.Tensor]:
        """One pass; per request ``[M + 1, V]`` float32 logits after ``committed + proposal[:i]``."""
        if not batch:
            return []
        return self._run([r.session for r in batch], [r.committed for r in batch],
                         [r.proposal for r in batch], [len(r.proposal) + 1 for r in batch])

    def prefill(self, session: bytes, prompt: Sequence[int]) -> torch.Tensor:
        """Cache the prompt; the next-token logits ``[V]``."""
        return self._run([session], [prompt], [[]], [1])[0][0]

    def decode_one(self, batch: Sequence[tuple[bytes, Sequence[int]]]) -> torch.Tensor:
        """Self-decoding step for many sessions: next-token logits ``[B, V]``."""
        if not batch:
            return torch.empty((0, self.vocab_size))
        out = self._run([s for s, _ in batch], [c for _, c in batch], [[] for _ in batch], [1] * len(batch))
        return torch.cat(out)

    def release(self, session: bytes) -> None:
        self.cache.release(session)


def _attention(name: str, device: torch.device) -> str:
    if name not in ATTENTION:
        raise ValueError(f"attention must be one of {ATTENTION}, not {name!r}")
    if name != "auto":
        return name
    if device.type != "cuda":
        return "sdpa"
    from sdcp_fast.kernels import backends

    return "triton" if backends.resolve("auto", device) == "triton" else "sdpa"


def greedy_token(logits: torch.Tensor) -> int:
    """Argmax with ties to the smallest id (§6.4 rule 1); torch.argmax promises no tie order."""
    top = logits.max()
    return int((logits == top).nonzero()[0, 0])
