"""Argument checks and normalisation shared by every backend.

Each backend receives already-validated, contiguous tensors with per-row profile
parameters, so the rules about shapes and "absent means disabled" live in one place.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

LOGIT_DTYPES = (torch.float32, torch.bfloat16)
KV_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@dataclass(frozen=True)
class Profile:
    """Per-row sampling profile, one int64 CPU tensor entry per row (backends move what they need).

    temperature_milli: 0 selects the argmax; top_k: 0 (or >= V) disables;
    top_p_milli: 0 (or >= 1000) disables.
    """

    temperature_milli: torch.Tensor
    top_k: torch.Tensor
    top_p_milli: torch.Tensor

    def is_plain(self) -> bool:
        """True when every row is plain softmax (temperature 1000, no top-k/top-p)."""
        return bool((self.temperature_milli == 1000).all() and (self.top_k == 0).all()
                    and (self.top_p_milli == 0).all())


def _per_row(value: int | torch.Tensor | None, rows: int, default: int, name: str,
             device: torch.device) -> torch.Tensor:
    if value is None:
        return torch.full((rows,), default, dtype=torch.int64, device=device)
    if isinstance(value, torch.Tensor):
        if value.dim() == 0:
            value = value.reshape(1).expand(rows)
        if value.shape != (rows,):
            raise ValueError(f"{name} must be a scalar or have shape ({rows},), got {tuple(value.shape)}")
        if value.dtype.is_floating_point or value.dtype == torch.bool:
            raise ValueError(f"{name} must be an integer tensor, got {value.dtype}")
        out = value.to(device=device, dtype=torch.int64).contiguous()
    else:
        out = torch.full((rows,), int(value), dtype=torch.int64, device=device)
    if bool((out < 0).any()):
        raise ValueError(f"{name} must be >= 0")
    return out


def profile(rows: int, temperature_milli: int | torch.Tensor | None, top_k: int | torch.Tensor | None,
            top_p_milli: int | torch.Tensor | None, vocab: int) -> Profile:
    """Normalise profile arguments: absent temperature is 1000, disabled filters become 0.

    Kept on the CPU, so that backends can branch on them without waiting for a device."""
    device = torch.device("cpu")
    t = _per_row(temperature_milli, rows, 1000, "temperature_milli", device)
    k = _per_row(top_k, rows, 0, "top_k", device)
    p = _per_row(top_p_milli, rows, 0, "top_p_milli", device)
    k = torch.where(k >= vocab, torch.zeros_like(k), k)
    p = torch.where(p >= 1000, torch.zeros_like(p), p)
    return Profile(t, k, p)


def logits_2d(x: torch.Tensor, name: str) -> torch.Tensor:
    if x.dim() != 2 or x.shape[1] == 0:
        raise ValueError(f"{name} must have shape [rows, V] with V > 0, got {tuple(x.shape)}")
    if x.dtype not in LOGIT_DTYPES:
        raise ValueError(f"{name} must be float32 or bfloat16, got {x.dtype}")
    return x.contiguous()


@dataclass(frozen=True)
class Ragged:
    """Draft layout: session b owns draft rows cu[b]:cu[b+1] and target rows cu[b]+b .. cu[b+1]+b."""

    cu_draft: torch.Tensor  # [B+1] int64, on CPU
    m_max: int

    @property
    def batch(self) -> int:
        return self.cu_draft.numel() - 1


def ragged(target_logits: torch.Tensor, draft_tokens: torch.Tensor, cu_draft: torch.Tensor) -> Ragged:
    """Check the ragged layout of a verification batch (one host sync on cu_draft)."""
    if cu_draft.dim() != 1 or cu_draft.numel() < 2:
        raise ValueError(f"cu_draft must have shape [B+1] with B >= 1, got {tuple(cu_draft.shape)}")
    if cu_draft.dtype.is_floating_point:
        raise ValueError("cu_draft must be an integer tensor")
    cu = cu_draft.to("cpu", torch.int64)
    if draft_tokens.dim() != 1 or draft_tokens.dtype.is_floating_point:
        raise ValueError(f"draft_tokens must be a 1-D integer tensor, got {tuple(draft_tokens.shape)}")
    counts = cu[1:] - cu[:-1]
    if int(cu[0]) != 0 or bool((counts < 0).any()) or int(cu[-1]) != draft_tokens.numel():
        raise ValueError("cu_draft must start at 0, be non-decreasing and end at len(draft_tokens)")
    batch = cu.numel() - 1
    if target_logits.shape[0] != draft_tokens.numel() + batch:
        raise ValueError(f"target_logits needs D + B = {draft_tokens.numel() + batch} rows "
                         f"(M_b + 1 per session), got {target_logits.shape[0]}")
    vocab = target_logits.shape[1]
    if draft_tokens.numel() and bool(((draft_tokens < 0) | (draft_tokens >= vocab)).any()):
        raise ValueError(f"draft_tokens must be token ids in [0, {vocab})")
    return Ragged(cu, int(counts.max()))


def uniforms(u: torch.Tensor, lay: Ragged) -> torch.Tensor:
    want = (lay.batch, lay.m_max + 1, 2)
    if tuple(u.shape) != want or u.dtype != torch.float64:
        raise ValueError(f"uniforms must be float64 of shape [B, M_max+1, 2] = {want}, "
                         f"got {u.dtype} {tuple(u.shape)}")
    return u.contiguous()


def paged_cache(cache: torch.Tensor) -> None:
    if cache.dim() != 4 or cache.dtype not in KV_DTYPES:
        raise ValueError(f"cache must be [num_blocks, block_size, H, D] float32/bfloat16/float16, "
                         f"got {cache.dtype} {tuple(cache.shape)}")
    if not cache.is_contiguous():
        raise ValueError("cache must be contiguous (it is written in place)")
