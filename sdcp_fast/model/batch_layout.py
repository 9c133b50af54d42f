"""Where a ragged batch's new tokens go in the paged KV cache and what each may attend to:
the layout one forward pass of ``llama.Transformer`` reads (the paged path's block table and
query offsets, or the gather path's padded indices and masks, sliding windows included)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .kv_cache import PagedKVCache


@dataclass
class BatchLayout:
    """Where a ragged batch's new tokens go and what each may attend to."""

    sessions: list[bytes]
    positions: torch.Tensor  # [T] int64
    slots: torch.Tensor  # [T] int64 cache slots of the new tokens (-1: a padding row, not written)
    table: torch.Tensor  # [B, max_blocks] int32 (int64 on the paged path)
    seq_lens: torch.Tensor  # [B] int32, cached + new (int64 on the paged path)
    q_lens: list[int]
    # Padded views, for B > 1: flat index of each (b, t) query / (b, j) key, and the mask.
    q_index: torch.Tensor | None = None  # [B, Tmax]
    k_index: torch.Tensor | None = None  # [B, Lmax]
    mask: torch.Tensor | None = None  # [B, 1, Tmax, Lmax] bool, True = attend
    # The paged path: the kernel backend of ``paged_attention`` (None: gather + SDPA) and the
    # first query row of each session.
    attention: str | None = None
    cu_q: torch.Tensor | None = None  # [B + 1] int64
    # Gather path: each query's position [B, Tmax] and its padding rows, for window masks.
    q_pos: torch.Tensor | None = None
    q_pad: torch.Tensor | None = None
    _windowed: dict[int, torch.Tensor] = field(default_factory=dict)

    def mask_for(self, window: int | None) -> torch.Tensor | None:
        """The gather path's mask for a layer with sliding ``window`` (None: ``mask``): a
        query at position p also needs key position > p - window."""
        if window is None or self.q_pos is None:
            return self.mask
        if window not in self._windowed:
            j = torch.arange(int(self.seq_lens.max()), device=self.q_pos.device)
            near = (j[None, None, :] > self.q_pos[:, :, None] - window)[:, None]  # [B, 1, Tmax, Lmax]
            m = near if self.mask is None else self.mask & near
            if self.q_pad is not None:
                m[:, 0, :, 0] |= self.q_pad  # padding queries attend to something (discarded later)
            self._windowed[window] = m
        return self._windowed[window]

    @staticmethod
    def pack(cache: PagedKVCache, sessions: list[bytes], new_tokens: list[list[int]], *, batch: int | None = None,
             width: int | None = None) -> tuple[torch.Tensor, int]:
        """Reserve cache slots for each session's new tokens and pack what a paged pass reads
        into one int64 host tensor, so that it reaches the device in one copy:
        ``tokens [T] | positions [T] | slots [T] | seq_lens [B] | cu_q [B + 1] | table [B, W]``.

        ``batch`` pads the batch with sessions that bring as many rows as the first one
        (token 0, slot -1 so nothing is written, table row 0) and ``width`` pads the table:
        the fixed shapes of a captured CUDA graph. A padding row reads block 0 and its output
        is discarded. Returns the tensor and the table's width."""
        toks: list[int] = []
        pos: list[int] = []
        slots: list[int] = []
        lens: list[int] = []
        cu = [0]
        for s, new in zip(sessions, new_tokens, strict=True):
            start = len(cache.seq(s).tokens)
            slots.extend(cache.append_slots(s, new))
            toks.extend(new)
            pos.extend(range(start, start + len(new)))
            lens.append(start + len(new))
            cu.append(cu[-1] + len(new))
        rows = len(new_tokens[0]) if new_tokens else 0
        pad = (batch or len(sessions)) - len(sessions)
        if pad < 0:
            raise ValueError(f"batch {batch} < {len(sessions)} sessions")
        for _ in range(pad):
            toks.extend([0] * rows)
            pos.extend(range(rows))
            slots.extend([-1] * rows)
            lens.append(rows)
            cu.append(cu[-1] + rows)
        blocks = [cache.seqs[s].blocks for s in sessions] + [[]] * pad
        need = max([1, -(-rows // cache.block_size), *(len(b) for b in blocks)])
        if width is not None and width < need:
            raise ValueError(f"table width {width} < {need} blocks")
        width = width or need
        table = [x for b in blocks for x in (*b, *[0] * (width - len(b)))]
        return torch.tensor([*toks, *pos, *slots, *lens, *cu, *table], dtype=torch.int64), width

    @classmethod
    def paged(cls, meta: torch.Tensor, sessions: list[bytes], rows: int, batch: int, width: int,
              attention: str) -> tuple[torch.Tensor, BatchLayout]:
        """The tokens ``[T]`` and the layout, as views of ``meta`` (made by :meth:`pack`,
        already on the cache's device; anything after the table is ignored) for ``rows``
        query rows of ``batch`` sessions."""
        T, B = rows, batch
        tokens, positions, slots = meta[:T], meta[T : 2 * T], meta[2 * T : 3 * T]
        seq_lens, cu_q = meta[3 * T : 3 * T + B], meta[3 * T + B : 3 * T + 2 * B + 1]
        table = meta[3 * T + 2 * B + 1 : 3 * T + 2 * B + 1 + B * width].view(B, width)
        return tokens, cls(sessions, positions, slots, table, seq_lens, [], attention=attention, cu_q=cu_q)

    @classmethod
    def build(cls, cache: PagedKVCache, sessions: list[bytes], new_tokens: list[list[int]]) -> BatchLayout:
        positions: list[int] = []
        slots: list[int] = []
        for s, toks in zip(sessions, new_tokens, strict=True):
            start = len(cache.seq(s).tokens)
            positions.extend(range(start, start + len(toks)))
            slots.extend(cache.append_slots(s, toks))
        dev = cache.device
        seq_lens = [len(cache.seqs[s].tokens) for s in sessions]
        q_lens = [len(t) for t in new_tokens]
        lay = cls(sessions, torch.tensor(positions, dtype=torch.int64, device=dev),
                  torch.tensor(slots, dtype=torch.int64, device=dev), cache.block_table(sessions),
                  torch.tensor(seq_lens, dtype=torch.int32, device=dev), q_lens)
        lay._pad(seq_lens, dev)
        return lay

    def _pad(self, seq_lens: list[int], dev: torch.device) -> None:
        B, tmax, lmax = len(seq_lens), max(self.q_lens), max(seq_lens)
        if B == 1:  # no padding: the gathered keys are already the one sequence's
            j = torch.arange(lmax, device=dev)
            q_pos = lmax - tmax + torch.arange(tmax, device=dev)
            self.q_pos = q_pos[None]
            if tmax > 1:
                self.mask = (j[None, :] <= q_pos[:, None])[None, None]  # [1, 1, T, L]
            return
        q_off = torch.tensor([0, *self.q_lens], device=dev).cumsum(0)[:-1]  # [B]
        k_off = torch.tensor([0, *seq_lens], device=dev).cumsum(0)[:-1]
        t = torch.arange(tmax, device=dev)
        j = torch.arange(lmax, device=dev)
        qn = torch.tensor(self.q_lens, device=dev)[:, None]
        kn = torch.tensor(seq_lens, device=dev)[:, None]
        q_valid = t[None] < qn  # [B, Tmax]
        k_valid = j[None] < kn  # [B, Lmax]
        self.q_index = (q_off[:, None] + t[None]).where(q_valid, q_off[:, None])
        self.k_index = (k_off[:, None] + j[None]).where(k_valid, k_off[:, None])
        q_pos = kn - qn + t[None]  # [B, Tmax] absolute position of each query
        mask = k_valid[:, None, :] & (j[None, None, :] <= q_pos[:, :, None])  # [B, Tmax, Lmax]
        mask[:, :, 0] |= ~q_valid  # padding queries attend to something (discarded later)
        self.mask = mask[:, None]
        self.q_pos, self.q_pad = q_pos, ~q_valid
