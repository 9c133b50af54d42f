"""Launchers of the ``triton`` backend; the @triton.jit bodies are in ``sdcp_fast.triton_kernels``.

Per-row statistics (max, first argmax, normalizer) come from split-vocabulary kernels.
Rows whose profile has top-k or top-p get their kept set from the reference ranking (a
torch sort on the device, only for those rows); everything else is Triton. Unlike the cpu
backend, the normalizers of all M_b + 1 rows are computed in one parallel pass (the GPU
would idle if positions were walked one at a time); the full q and target rows are still
read only at the first rejected position, and the last target row fully only when all
positions are accepted.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton

from sdcp_fast.triton_kernels import paged_kv as kv_kernels
from sdcp_fast.triton_kernels import sampling as kernels

from . import reference
from .params import Profile, Ragged

MAX_BLOCK = 1024


def _block(vocab: int) -> tuple[int, int]:
    # At least 128 ids: every small vocabulary then shares one compiled specialization.
    block = min(MAX_BLOCK, max(128, triton.next_power_of_2(vocab)))
    return block, triton.cdiv(vocab, block)


@dataclass
class RowStats:
    """p of each row: kept(j) ? exp((l_j - lmax) / temp) / norm : 0 (w = 1 on greedy rows)."""

    lmax: torch.Tensor  # float32 [R]
    norm: torch.Tensor  # float32 [R]
    temp: torch.Tensor  # float32 [R]
    thr: torch.Tensor  # float32 [R]
    thr_id: torch.Tensor  # int64 [R]
    filtered: torch.Tensor  # int8 [R]
    greedy: torch.Tensor  # int8 [R]
    argmax: torch.Tensor  # int32 [R]

    def args(self) -> tuple[torch.Tensor, ...]:
        return (self.lmax, self.norm, self.temp, self.thr, self.thr_id, self.filtered, self.greedy)


def _row_stats(logits: torch.Tensor, prof: Profile) -> RowStats:
    """Statistics of every row; ``prof`` is on the CPU, so branching on it costs no device sync."""
    rows, vocab = logits.shape
    dev = logits.device
    block, nblk = _block(vocab)
    greedy = prof.temperature_milli == 0
    top = (prof.top_k > 0) | (prof.top_p_milli > 0)
    if bool((prof.temperature_milli == 1000).all()):
        temp = torch.ones(rows, dtype=torch.float32, device=dev)
    else:
        temp = (torch.where(greedy, 1000, prof.temperature_milli).to(torch.float32) / 1000.0).to(dev)
    part_max = torch.empty(rows, nblk, dtype=torch.float32, device=dev)
    part_sum = torch.empty_like(part_max)
    part_arg = torch.empty(rows, nblk, dtype=torch.int32, device=dev)
    kernels.row_partials_kernel[(rows, nblk)](logits, temp, part_max, part_sum, part_arg, vocab, nblk,
                                              BLOCK=block)
    lmax = torch.empty(rows, dtype=torch.float32, device=dev)
    norm = torch.empty_like(lmax)
    argmax = torch.empty(rows, dtype=torch.int32, device=dev)
    kernels.row_combine_kernel[(rows,)](part_max, part_sum, part_arg, temp, lmax, norm, argmax, vocab, nblk,
                                        NBLK_P2=triton.next_power_of_2(nblk))
    if not bool(greedy.any() | top.any()):  # plain softmax rows: nothing is filtered
        off = torch.zeros(rows, dtype=torch.int8, device=dev)
        return RowStats(lmax=lmax, norm=norm, temp=temp, thr=lmax, thr_id=argmax.long(), filtered=off,
                        greedy=off, argmax=argmax)
    greedy_d = greedy.to(dev)
    stats = RowStats(lmax=lmax, norm=torch.where(greedy_d, 1.0, norm), temp=temp,
                     thr=torch.where(greedy_d, lmax, 0.0), thr_id=torch.where(greedy_d, argmax.long(), 0),
                     filtered=(greedy | top).to(torch.int8).to(dev), greedy=greedy.to(torch.int8).to(dev),
                     argmax=argmax)
    ranked = torch.nonzero(top & ~greedy).squeeze(1)
    if ranked.numel():
        _ranked_rows(logits, prof, ranked, stats)
    return stats


def _ranked_rows(logits: torch.Tensor, prof: Profile, rows: torch.Tensor, stats: RowStats) -> None:
    """Kept set of top-k/top-p rows from the reference ranking, as (thr, thr_id) and norm."""
    rows_d = rows.to(logits.device)
    x = logits[rows_d]
    sub = Profile(prof.temperature_milli[rows], prof.top_k[rows], prof.top_p_milli[rows])
    kept = reference.profile_probs(x, sub) > 0
    xf = x.to(torch.float32)
    thr = torch.where(kept, xf, float("inf")).min(dim=1).values
    ids = torch.arange(x.shape[1], device=x.device)
    thr_id = torch.where(kept & (xf == thr.unsqueeze(1)), ids, -1).max(dim=1).values
    w = torch.exp((xf.double() - stats.lmax[rows_d].double().unsqueeze(1))
                  / stats.temp[rows_d].double().unsqueeze(1))
    stats.norm[rows_d] = torch.where(kept, w, 0.0).sum(dim=1).to(torch.float32)
    stats.thr[rows_d] = thr
    stats.thr_id[rows_d] = thr_id


def _draw(src: torch.Tensor, q: torch.Tensor, draw_row: torch.Tensor, draw_q: torch.Tensor, draw_u: torch.Tensor,
          stats: RowStats | None) -> torch.Tensor:
    """One inverse-CDF draw per entry: from raw rows of ``src`` (stats None), or from the residual
    max(0, p - q[draw_q]) (p itself where draw_q is -1, or where the residual has no mass)."""
    n, vocab = draw_row.numel(), src.shape[1]
    block, nblk = _block(vocab)
    raw = stats is None
    stat_args = (src,) * 7 if stats is None else stats.args()  # unused pointers when raw
    part = torch.empty(n, nblk, dtype=torch.float64, device=src.device)
    part_p = part if raw else torch.empty_like(part)
    out = torch.empty(n, dtype=torch.int32, device=src.device)
    kernels.draw_partials_kernel[(n, nblk)](src, q, draw_row, draw_q, *stat_args, part, part_p, vocab, nblk,
                                            BLOCK=block, RAW=raw)
    kernels.draw_select_kernel[(n,)](src, q, draw_row, draw_q, draw_u, *stat_args, part, part_p, out, vocab,
                                     nblk, BLOCK=block, RAW=raw)
    return out


def apply_sampling_profile(logits: torch.Tensor, prof: Profile) -> torch.Tensor:
    rows, vocab = logits.shape
    stats = _row_stats(logits, prof)
    probs = torch.empty(rows, vocab, dtype=torch.float32, device=logits.device)
    block, nblk = _block(vocab)
    kernels.profile_write_kernel[(rows, nblk)](logits, *stats.args(), probs, vocab, BLOCK=block)
    return probs


def sample_from_probs(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    n = probs.shape[0]
    rows = torch.arange(n, device=probs.device)
    return _draw(probs, probs, rows, torch.full_like(rows, -1), u, None)


def _row_profile(prof: Profile, lay: Ragged) -> Profile:
    """Each session's profile repeated over its M_b + 1 target rows (on the CPU)."""
    session = torch.repeat_interleave(torch.arange(lay.batch), lay.cu_draft[1:] - lay.cu_draft[:-1] + 1)
    return Profile(prof.temperature_milli[session], prof.top_k[session], prof.top_p_milli[session])


def verify_greedy(target_logits: torch.Tensor, draft_tokens: torch.Tensor,
                  lay: Ragged) -> tuple[torch.Tensor, torch.Tensor]:
    dev = target_logits.device
    rows = target_logits.shape[0]
    plain = Profile(torch.full((rows,), 1000), torch.zeros(rows, dtype=torch.int64),
                    torch.zeros(rows, dtype=torch.int64))
    stats = _row_stats(target_logits, plain)
    accepted = torch.zeros(lay.batch, dtype=torch.int32, device=dev)
    emitted = torch.full((lay.batch, lay.m_max + 1), -1, dtype=torch.int32, device=dev)
    kernels.greedy_accept_kernel[(lay.batch,)](stats.argmax, draft_tokens, lay.cu_draft.to(dev), accepted, emitted,
                                               lay.m_max + 1)
    return accepted, emitted


def verify_speculative(target_logits: torch.Tensor, prof: Profile, q_probs: torch.Tensor,
                       draft_tokens: torch.Tensor, lay: Ragged,
                       u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    dev = target_logits.device
    batch, width = lay.batch, lay.m_max + 1
    stats = _row_stats(target_logits, _row_profile(prof, lay))
    accepted = torch.zeros(batch, dtype=torch.int32, device=dev)
    emitted = torch.full((batch, width), -1, dtype=torch.int32, device=dev)
    bad = torch.zeros(batch, dtype=torch.int8, device=dev)
    draw_row = torch.empty(batch, dtype=torch.int64, device=dev)
    draw_q = torch.empty_like(draw_row)
    draw_u = torch.empty(batch, dtype=torch.float64, device=dev)
    q = q_probs if q_probs.numel() else torch.zeros(1, target_logits.shape[1], device=dev)
    kernels.speculative_accept_kernel[(batch,)](target_logits, q, draft_tokens, lay.cu_draft.to(dev), u,
                                                *stats.args(), accepted, emitted, bad, draw_row, draw_q, draw_u,
                                                target_logits.shape[1], width)
    extra = _draw(target_logits, q, draw_row, draw_q, draw_u, stats)
    emitted.scatter_(1, accepted.long().unsqueeze(1), extra.unsqueeze(1))
    return accepted, emitted, bad.bool()


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
