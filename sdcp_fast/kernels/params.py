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


def on_host(t: torch.Tensor) -> bool:
    """Whether reading ``t``'s values costs no device sync (the no-sync tests patch this)."""
    return t.device.type == "cpu"


@dataclass(frozen=True)
class DeviceProfile:
    """Profile for the triton backend: per member an int (every row) or an integer tensor on the
    logits' device, ``[rows]`` or 0-d. Ints and host tensors are checked and normalised here;
    a device tensor is checked by the kernels (a negative entry flags its row), so nothing waits."""

    temperature_milli: int | torch.Tensor
    top_k: int | torch.Tensor
    top_p_milli: int | torch.Tensor

    def may_filter(self) -> bool:
        """False when no row can have top-k or top-p (the kernels then skip the kept-set search)."""
        if isinstance(self.top_k, torch.Tensor) or isinstance(self.top_p_milli, torch.Tensor):
            return True
        return self.top_k != 0 or self.top_p_milli != 0


def _device_member(value: int | torch.Tensor | None, rows: int, default: int, name: str, vocab: int,
                   off_from: int, device: torch.device) -> int | torch.Tensor:
    if value is None:
        return default
    if isinstance(value, torch.Tensor) and not on_host(value):
        if value.dim() > 1 or (value.dim() == 1 and value.shape != (rows,)):
            raise ValueError(f"{name} must be a scalar or have shape ({rows},), got {tuple(value.shape)}")
        if value.dtype.is_floating_point or value.dtype == torch.bool:
            raise ValueError(f"{name} must be an integer tensor, got {value.dtype}")
        if value.device != device:
            raise ValueError(f"{name} must be on the logits' device {device}, not {value.device}")
        return value
    if isinstance(value, torch.Tensor) and value.dim() > 0:
        out = _per_row(value, rows, default, name, torch.device("cpu"))
        out = torch.where(out >= off_from, torch.zeros_like(out), out) if off_from else out
        return out.to(device, non_blocking=True)
    v = int(value)
    if v < 0:
        raise ValueError(f"{name} must be >= 0")
    return 0 if off_from and v >= off_from else v


def device_profile(rows: int, temperature_milli: int | torch.Tensor | None, top_k: int | torch.Tensor | None,
                   top_p_milli: int | torch.Tensor | None, vocab: int, device: torch.device) -> DeviceProfile:
    """:func:`profile` for the triton backend, without reading device memory."""
    return DeviceProfile(_device_member(temperature_milli, rows, 1000, "temperature_milli", vocab, 0, device),
                         _device_member(top_k, rows, 0, "top_k", vocab, vocab, device),
                         _device_member(top_p_milli, rows, 0, "top_p_milli", vocab, 1000, device))


def logits_2d(x: torch.Tensor, name: str) -> torch.Tensor:
    if x.dim() != 2 or x.shape[1] == 0:
        raise ValueError(f"{name} must have shape [rows, V] with V > 0, got {tuple(x.shape)}")
    if x.dtype not in LOGIT_DTYPES:
        raise ValueError(f"{name} must be float32 or bfloat16, got {x.dtype}")
    return x.contiguous()


@dataclass(frozen=True)
class Ragged:
    """Draft layout: session b owns draft rows cu[b]:cu[b+1] and target rows cu[b]+b .. cu[b+1]+b.

    ``cu_draft`` is on the CPU and checked, unless ``checked`` is false: then it is the caller's
    device tensor, ``m_max + 1`` is the width the caller gave, and the kernels check the layout."""

    cu_draft: torch.Tensor  # [B+1] int64
    m_max: int
    checked: bool = True

    @property
    def batch(self) -> int:
        return self.cu_draft.numel() - 1


def ragged(target_logits: torch.Tensor, draft_tokens: torch.Tensor, cu_draft: torch.Tensor,
           width: int | None = None, sync_free: bool = False) -> Ragged:
    """Check the ragged layout of a verification batch.

    Reads cu_draft and the token ids on the host (one device sync where they live on a
    device) unless ``sync_free`` (the triton backend): then only host tensors are read, and a
    device cu_draft takes its M_max + 1 from ``width`` (the kernels flag what does not fit).
    """
    if cu_draft.dim() != 1 or cu_draft.numel() < 2:
        raise ValueError(f"cu_draft must have shape [B+1] with B >= 1, got {tuple(cu_draft.shape)}")
    if cu_draft.dtype.is_floating_point or cu_draft.dtype == torch.bool:
        raise ValueError("cu_draft must be an integer tensor")
    if draft_tokens.dim() != 1 or draft_tokens.dtype.is_floating_point:
        raise ValueError(f"draft_tokens must be a 1-D integer tensor, got {tuple(draft_tokens.shape)}")
    batch = cu_draft.numel() - 1
    if target_logits.shape[0] != draft_tokens.numel() + batch:
        raise ValueError(f"target_logits needs D + B = {draft_tokens.numel() + batch} rows "
                         f"(M_b + 1 per session), got {target_logits.shape[0]}")
    vocab = target_logits.shape[1]
    if sync_free and not on_host(cu_draft) and width is not None:
        if width < 1:
            raise ValueError(f"the emitted width (M_max + 1) must be >= 1, got {width}")
        return Ragged(cu_draft, width - 1, checked=False)
    cu = cu_draft.to("cpu", torch.int64)
    # Read as one list: a torch op per check cost more than the round's verification itself.
    ends = cu.tolist()
    counts = [b - a for a, b in zip(ends[:-1], ends[1:], strict=True)]
    if ends[0] != 0 or min(counts) < 0 or ends[-1] != draft_tokens.numel():
        raise ValueError("cu_draft must start at 0, be non-decreasing and end at len(draft_tokens)")
    if draft_tokens.numel() and (not sync_free or on_host(draft_tokens)):
        lo, hi = torch.aminmax(draft_tokens)
        if int(lo) < 0 or int(hi) >= vocab:
            raise ValueError(f"draft_tokens must be token ids in [0, {vocab})")
    return Ragged(cu, max(counts))


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
