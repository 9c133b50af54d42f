"""Paged KV cache: fixed-size blocks, a free list, and one block table per session.

Layout (as vLLM / FlashInfer): for each layer, ``k[layer]`` and ``v[layer]`` are
``[num_blocks, block_size, n_kv_heads, head_dim]``. Position ``i`` of a session lives in
block ``table[i // block_size]`` at offset ``i % block_size`` (slot
``block * block_size + offset``). Reads and writes go through ``sdcp_fast.kernels``.

The cache stores tensors and token ids only; it knows no model. A session's ``tokens``
records which token produced each cached position, so a caller can reconcile the cache
against a committed list: keep the longest common prefix, truncate the table (whole
blocks go back to the free list, the prefix is never copied), compute the rest.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from sdcp_fast.kernels import gather_paged_kv, write_paged_kv


class KVBlocksExhausted(RuntimeError):
    """No free block is left and the pool may not grow."""


@dataclass
class SequenceState:
    blocks: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)  # the token of each cached position


class PagedKVCache:
    def __init__(self, n_layers: int, n_kv_heads: int, head_dim: int, *, block_size: int = 16,
                 num_blocks: int = 64, max_blocks: int | None = None, dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu") -> None:
        self.n_layers, self.n_kv_heads, self.head_dim = n_layers, n_kv_heads, head_dim
        self.block_size = block_size
        self.max_blocks = max_blocks  # None: grow without bound (doubling)
        self.dtype, self.device = dtype, torch.device(device)
        shape = (num_blocks, block_size, n_kv_heads, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=self.device) for _ in range(n_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=self.device) for _ in range(n_layers)]
        # Popped from the end: low block ids are handed out first.
        self.free: list[int] = list(range(num_blocks - 1, -1, -1))
        self.seqs: dict[bytes, SequenceState] = {}

    @property
    def num_blocks(self) -> int:
        return self.k[0].shape[0] if self.k else 0

    def _grow(self) -> None:
        old = self.num_blocks
        new = old * 2 if old else 16
        if self.max_blocks is not None:
            new = min(new, self.max_blocks)
        if new <= old:
            raise KVBlocksExhausted(f"all {old} KV blocks are in use")
        pad = (new - old, self.block_size, self.n_kv_heads, self.head_dim)
        for layer in range(self.n_layers):
            self.k[layer] = torch.cat([self.k[layer], self.k[layer].new_zeros(pad)])
            self.v[layer] = torch.cat([self.v[layer], self.v[layer].new_zeros(pad)])
        self.free[:0] = range(new - 1, old - 1, -1)

    def _alloc(self) -> int:
        if not self.free:
            self._grow()
        return self.free.pop()

    def seq(self, session: bytes) -> SequenceState:
        return self.seqs.setdefault(session, SequenceState())

    def truncate(self, session: bytes, length: int) -> None:
        """Keep positions ``0..length-1``; blocks wholly past them return to the free list."""
        st = self.seq(session)
        length = min(length, len(st.tokens))
        keep = -(-length // self.block_size)
        self.free.extend(reversed(st.blocks[keep:]))
        del st.blocks[keep:]
        del st.tokens[length:]

    def reconcile(self, session: bytes, committed: Sequence[int], keep_last: int = 1) -> int:
        """Truncate the session to the longest prefix it shares with ``committed``, but at
        most ``len(committed) - keep_last`` (the caller needs outputs for those last
        positions, so they are recomputed). Returns the number of positions kept."""
        st = self.seq(session)
        limit = min(len(st.tokens), len(committed) - keep_last)
        n = 0
        while n < limit and st.tokens[n] == committed[n]:
            n += 1
        self.truncate(session, n)
        return n

    def append_slots(self, session: bytes, tokens: Sequence[int]) -> list[int]:
        """Reserve positions for ``tokens`` after the session's last cached one; their slots."""
        st = self.seq(session)
        start = len(st.tokens)
        end = start + len(tokens)
        while len(st.blocks) * self.block_size < end:
            st.blocks.append(self._alloc())
        st.tokens.extend(tokens)
        bs = self.block_size
        return [st.blocks[i // bs] * bs + i % bs for i in range(start, end)]

    def release(self, session: bytes) -> None:
        if session in self.seqs:
            self.truncate(session, 0)
            del self.seqs[session]

    def block_table(self, sessions: Sequence[bytes]) -> torch.Tensor:
        """``[B, max_blocks]`` int32, padded with 0 (never read past ``seq_lens``)."""
        rows = [self.seqs[s].blocks for s in sessions]
        width = max(1, max(len(r) for r in rows))
        table = torch.zeros((len(rows), width), dtype=torch.int32)
        for i, r in enumerate(rows):
            table[i, : len(r)] = torch.tensor(r, dtype=torch.int32)
        return table.to(self.device)

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor) -> None:
        write_paged_kv(self.k[layer], k, slots)  # k, v: [T, H_kv, D]
        write_paged_kv(self.v[layer], v, slots)

    def gather(self, layer: int, table: torch.Tensor, seq_lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        k = gather_paged_kv(self.k[layer], table, seq_lens)  # [sum(seq_lens), H_kv, D]
        v = gather_paged_kv(self.v[layer], table, seq_lens)
        return k, v

    def used_blocks(self) -> int:
        return self.num_blocks - len(self.free)
