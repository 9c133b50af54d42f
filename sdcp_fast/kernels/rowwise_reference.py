"""The float parts of a CPU decoder pass, in plain torch, one row at a time: the definition the
C++ kernels (``csrc/rowwise_kernels.cpp``) are tested against.

Each function computes every output row from its own input row only, so what a row gets does
not depend on how many rows share the call; the C++ kernels keep that property bit for bit
(their sums run in an order fixed by the row alone), torch's batched kernels do not promise it.
Shapes are those of :mod:`.rowwise`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def add_rms_norm(x: torch.Tensor, delta: torch.Tensor | None, w: torch.Tensor, eps: float,
                 unit_offset: bool = False) -> torch.Tensor:
    """``x += delta`` (in place, when given), then RMSNorm of each row of ``x`` ``[T, dim]``."""
    if delta is not None:
        x += delta
    xf = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return xf * (1.0 + w) if unit_offset else w * xf


def rope_table(positions: torch.Tensor, inv_freq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin ``[T, D/2]`` of ``positions`` ``[T]`` times ``inv_freq`` ``[D/2]``."""
    a = positions.float()[:, None] * inv_freq.float()
    return a.cos(), a.sin()


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos[:, None] - x2 * sin[:, None], x2 * cos[:, None] + x1 * sin[:, None]], dim=-1)


def rope_append(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                slots: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
    """Rotated ``q`` ``[T, H, D]``; rotated ``k`` and ``v`` ``[T, Hkv, D]`` written to cache slots
    ``slots`` ``[T]`` (-1: not written) of ``k_cache``/``v_cache`` ``[blocks, block_size, Hkv, D]``."""
    keep = slots >= 0
    kf, vf = k_cache.view(-1, *k_cache.shape[2:]), v_cache.view(-1, *v_cache.shape[2:])
    kf[slots[keep]] = _rotate(k, cos, sin)[keep]
    vf[slots[keep]] = v[keep]
    return _rotate(q, cos, sin)


def paged_attention_rows(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, table: torch.Tensor,
                         row_seq: torch.Tensor, row_pos: torch.Tensor, scale: float, window: int | None = None,
                         softcap: float | None = None) -> torch.Tensor:
    """Query row r (``q`` ``[T, H, D]``) of session ``row_seq[r]`` at position ``row_pos[r]``
    attends to that session's positions ``0..row_pos[r]`` (the last ``window`` of them with a
    window), read through ``table`` ``[B, max_blocks]``; ``[T, H, D]``."""
    bs, hkv = k_cache.shape[1], k_cache.shape[2]
    rep = q.shape[1] // hkv
    out = torch.empty_like(q)
    for r in range(q.shape[0]):
        pos = int(row_pos[r])
        j = torch.arange(0 if window is None else max(0, pos - window + 1), pos + 1)
        slot = table[int(row_seq[r])].long()[j // bs] * bs + j % bs
        keys = k_cache.view(-1, hkv, k_cache.shape[3])[slot].repeat_interleave(rep, dim=1)  # [L, H, D]
        vals = v_cache.view(-1, hkv, v_cache.shape[3])[slot].repeat_interleave(rep, dim=1)
        s = torch.einsum("hd,lhd->hl", q[r].double(), keys.double()) * scale
        if softcap is not None:
            s = torch.tanh(s / softcap) * softcap
        out[r] = torch.einsum("hl,lhd->hd", s.softmax(-1), vals.double()).to(q.dtype)
    return out


def gated_act(gate: torch.Tensor, up: torch.Tensor, act: str = "silu") -> torch.Tensor:
    """``act(gate) * up``, ``[T, F]``; ``act``: ``silu`` or ``gelu_tanh``."""
    a = F.gelu(gate, approximate="tanh") if act == "gelu_tanh" else F.silu(gate)
    return a * up


def linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x`` ``[T, K]`` times ``w`` ``[N, K]`` transposed (+ ``bias``), summed in float64."""
    y = x.double() @ w.double().T
    return (y if bias is None else y + bias.double()).float()
