"""Launchers of the ``triton`` backend; the @triton.jit bodies are in ``sdcp_fast.triton_kernels``.

Each call is two launches (``sample_from_probs`` one) and nothing here reads a device value:
shapes come from tensor metadata, grid sizes from V and the row count, outputs are
allocated with ``torch.empty`` and written whole by the kernels. So with its inputs on the
device a call neither waits for the GPU nor breaks a CUDA-graph capture
(tests/kernels/test_no_sync.py and test_cuda_graph.py). Top-k/top-p kept sets come from a
pivot search in the kernels, not from a sort.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton

from sdcp_fast.triton_kernels import paged_kv as kv_kernels
from sdcp_fast.triton_kernels import sampling as kernels

from . import reference
from .params import DeviceProfile, Ragged

MAX_BLOCK = 1024
SPLITS = 32  # pass-1 programs per row, at most: a small batch still spreads over the GPU
PIVOTS = 16  # keys tried per search pass over a filtered row


@dataclass(frozen=True)
class Grid:
    """How pass 1 cuts a row; a function of V only, so a row's sums never depend on its batch."""

    block: int
    chunk: int  # blocks per pass-1 program
    splits: int

    @property
    def splits_p2(self) -> int:
        return triton.next_power_of_2(self.splits)

    def blocks_p2(self, vocab: int) -> int:
        return triton.next_power_of_2(triton.cdiv(vocab, self.block))

    def scratch(self, draws: int, vocab: int, device: torch.device) -> torch.Tensor:
        """Block sums of each inverse-CDF draw (weights and p), float64."""
        return torch.empty(max(1, draws) * 2 * self.blocks_p2(vocab), dtype=torch.float64, device=device)


def _grid(vocab: int) -> Grid:
    # At least 128 ids: every small vocabulary then shares one compiled specialization.
    block = min(MAX_BLOCK, max(128, triton.next_power_of_2(vocab)))
    nblk = triton.cdiv(vocab, block)
    chunk = triton.cdiv(nblk, SPLITS)
    return Grid(block, chunk, triton.cdiv(nblk, chunk))


def _profile_args(prof: DeviceProfile, like: torch.Tensor) -> tuple[tuple[object, ...], dict[str, bool]]:
    """(ptr, stride, scalar) per member, and which members are per-row tensors."""
    args: list[object] = []
    flags = {}
    for name, value in (("T_ROW", prof.temperature_milli), ("K_ROW", prof.top_k), ("P_ROW", prof.top_p_milli)):
        if isinstance(value, torch.Tensor):
            args += [value, value.stride(0) if value.dim() else 0, 0]
            flags[name] = True
        else:
            args += [like, 0, value]
            flags[name] = False
    return tuple(args), flags


@dataclass
class Partials:
    grid: Grid
    max: torch.Tensor  # float32 [R * splits]
    sum: torch.Tensor  # float32 [R * splits]
    arg: torch.Tensor  # int32 [R * splits]
    thr: torch.Tensor  # float32 [R], written for searched rows only
    thr_id: torch.Tensor  # int64 [R], idem

    def args(self) -> tuple[torch.Tensor, ...]:
        return (self.max, self.sum, self.arg, self.thr, self.thr_id)


def _partials(logits: torch.Tensor, prof_args: tuple[object, ...], flags: dict[str, bool], search: bool,
              cu: torch.Tensor | None, exp: bool = True) -> Partials:
    """Pass 1 over every row; ``cu`` maps rows to sessions (verify), None: one profile entry per row."""
    rows, vocab = logits.shape
    g = _grid(vocab)
    dev = logits.device
    part_max = torch.empty(rows * g.splits, dtype=torch.float32, device=dev)
    part_sum = torch.empty_like(part_max) if exp else part_max
    part_arg = torch.empty(rows * g.splits, dtype=torch.int32, device=dev)
    thr = torch.empty(rows if search else 1, dtype=torch.float32, device=dev)
    thr_id = torch.empty(rows if search else 1, dtype=torch.int64, device=dev)
    batch = cu.numel() - 1 if cu is not None else rows
    kernels.row_partials_kernel[(rows, g.splits)](
        logits, part_max, part_sum, part_arg, thr, thr_id, cu if cu is not None else part_arg, *prof_args,
        vocab, batch, g.splits, g.chunk, BLOCK=g.block, LOG_B=max(1, batch.bit_length()),
        SESSION_ROWS=cu is not None, EXP=exp, SEARCH=search, NPIV=PIVOTS, **flags)
    return Partials(g, part_max, part_sum, part_arg, thr, thr_id)


def _on(t: torch.Tensor, dev: torch.device) -> torch.Tensor:
    return t if t.device == dev else t.to(dev, non_blocking=True)


def apply_sampling_profile(logits: torch.Tensor, prof: DeviceProfile) -> torch.Tensor:
    rows, vocab = logits.shape
    prof_args, flags = _profile_args(prof, logits)
    search = prof.may_filter()
    part = _partials(logits, prof_args, flags, search, None)
    probs = torch.empty(rows, vocab, dtype=torch.float32, device=logits.device)
    g = part.grid
    kernels.profile_write_kernel[(rows, g.splits)](logits, *part.args(), probs, *prof_args, vocab, g.splits, g.chunk,
                                                   BLOCK=g.block, NSPLIT_P2=g.splits_p2, SEARCH=search, **flags)
    return probs


def sample_from_probs(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    n, vocab = probs.shape
    out = torch.empty(n, dtype=torch.int32, device=probs.device)
    if n:
        g = _grid(vocab)
        kernels.sample_kernel[(n,)](probs, u, out, g.scratch(n, vocab, probs.device), vocab, BLOCK=g.block,
                                    NBLK_P2=g.blocks_p2(vocab))
    return out


def verify_greedy(target_logits: torch.Tensor, draft_tokens: torch.Tensor,
                  lay: Ragged) -> tuple[torch.Tensor, torch.Tensor]:
    dev = target_logits.device
    vocab = target_logits.shape[1]
    width = lay.m_max + 1
    cu = _on(lay.cu_draft, dev)
    plain, flags = _profile_args(DeviceProfile(1000, 0, 0), target_logits)
    part = _partials(target_logits, plain, flags, False, cu, exp=False)
    accepted = torch.empty(lay.batch, dtype=torch.int32, device=dev)
    emitted = torch.empty(lay.batch, width, dtype=torch.int32, device=dev)
    g = part.grid
    kernels.greedy_kernel[(lay.batch,)](part.max, part.arg, draft_tokens, cu, accepted, emitted, vocab, lay.batch,
                                        draft_tokens.numel(), width, g.splits, NSPLIT_P2=g.splits_p2,
                                        W_P2=triton.next_power_of_2(width))
    return accepted, emitted


def verify_speculative(target_logits: torch.Tensor, prof: DeviceProfile, q_probs: torch.Tensor,
                       draft_tokens: torch.Tensor, lay: Ragged,
                       u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    dev = target_logits.device
    vocab = target_logits.shape[1]
    batch, width = lay.batch, u.shape[1]
    cu = _on(lay.cu_draft, dev)
    prof_args, flags = _profile_args(prof, target_logits)
    search = prof.may_filter()
    part = _partials(target_logits, prof_args, flags, search, cu)
    accepted = torch.empty(batch, dtype=torch.int32, device=dev)
    emitted = torch.empty(batch, width, dtype=torch.int32, device=dev)
    bad = torch.empty(batch, dtype=torch.bool, device=dev)
    # an empty q (no session proposes) still needs a pointer; it is never read
    q = q_probs if q_probs.numel() else torch.empty(1, dtype=torch.float32, device=dev)
    g = part.grid
    kernels.speculative_kernel[(batch,)](target_logits, q, draft_tokens, cu, u, *part.args(), *prof_args, accepted,
                                         emitted, bad, g.scratch(batch, vocab, dev), vocab, batch,
                                         draft_tokens.numel(), width, g.splits, BLOCK=g.block,
                                         NBLK_P2=g.blocks_p2(vocab), NSPLIT_P2=g.splits_p2,
                                         W_P2=triton.next_power_of_2(width), SEARCH=search, **flags)
    return accepted, emitted, bad


def write_paged_kv(cache: torch.Tensor, values: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    row = cache.shape[2] * cache.shape[3]
    if values.shape[0] == 0:
        return
    block = min(1024, triton.next_power_of_2(row))
    kv_kernels.write_kernel[(values.shape[0], triton.cdiv(row, block))](cache, values, slot_mapping, row,
                                                                         cache.shape[0] * cache.shape[1],
                                                                         BLOCK=block)


def gather_paged_kv(cache: torch.Tensor, block_table: torch.Tensor, seq_lens: torch.Tensor) -> torch.Tensor:
    slots = reference.gather_slots(block_table, seq_lens, cache.shape[1])
    out = torch.empty((slots.numel(), *cache.shape[2:]), dtype=cache.dtype, device=cache.device)
    row = cache.shape[2] * cache.shape[3]
    if slots.numel():
        block = min(1024, triton.next_power_of_2(row))
        kv_kernels.gather_kernel[(slots.numel(), triton.cdiv(row, block))](cache, slots, out, row, BLOCK=block)
    return out


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
                    seq_lens: torch.Tensor, cu_q: torch.Tensor, scale: float, window: int | None = None,
                    softcap: float | None = None) -> torch.Tensor:
    from sdcp_fast.triton_kernels import attention as attn_kernels

    dev = q.device
    rows, heads, dim = q.shape
    kv_heads, block_size = k_cache.shape[2], k_cache.shape[1]
    batch = block_table.shape[0]
    out = torch.empty_like(q)
    if rows == 0:
        return out
    table = _on(block_table, dev).contiguous()
    group = heads // kv_heads
    attn_kernels.paged_attention_kernel[(rows, kv_heads)](
        q, k_cache, v_cache, table, _on(seq_lens, dev), _on(cu_q, dev), out, scale, batch, table.shape[1],
        heads, kv_heads, dim, window or 0, float(softcap or 0.0), WINDOWED=window is not None,
        CAPPED=softcap is not None, GROUP=group, GROUP_P2=triton.next_power_of_2(group),
        D_P2=triton.next_power_of_2(dim), BS=block_size, BS_P2=triton.next_power_of_2(block_size),
        LOG_B=max(1, batch.bit_length()))
    return out
