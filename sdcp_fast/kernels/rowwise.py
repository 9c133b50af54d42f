"""The float parts of a CPU decoder pass, row-invariant: the C++ kernels of
``csrc/rowwise_kernels.cpp`` (``cpu``) and their plain-torch definition (``reference``,
:mod:`.rowwise_reference`).

RMSNorm (with the residual add before it), RoPE with the KV-cache append, causal attention over
a paged cache, the gated activation (SiLU or tanh GELU) and the float32 matrix product. Each
output row is computed from its own input row alone, with sums in an order fixed by the row's
own sizes, so a pass over M + 1 positions gives every position the bits a one-position pass
gives it (within one instruction set): what keeps rule 1's output equal to one-row decoding
when the products round activations to int8 blocks (``--weights q4``). torch's kernels make no
such promise (a one-row product takes a different path than a many-row one; SDPA splits work
by the query count).

All tensors are float32 host tensors (positions, slots: int64; block table, row sessions:
int32). ``available()`` says whether the C++ kernels are there; without them ``auto`` is the
reference (``native.status()`` says why).
"""

from __future__ import annotations

import math

import torch

from sdcp_fast import native

from . import rowwise_reference as ref

__all__ = ["ACTS", "add_rms_norm", "available", "gated_act", "isa", "linear", "paged_attention_rows",
           "rope_append", "rope_table"]

BACKENDS = ("auto", "reference", "cpu")
ACTS = {"silu": 0, "gelu_tanh": 1}


def available() -> bool:
    """The C++ kernels are built and loaded."""
    return native.available() and hasattr(native.module(), "rw_linear_f32")


def isa() -> str:
    """The instruction set the C++ kernels use (``scalar`` or ``avx2``; follows ``quant.use_isa``)."""
    return str(native.module().rowwise_isa())


def _cpu(backend: str) -> bool:
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, not {backend!r}")
    if backend == "cpu" and not available():
        raise native.NativeUnavailable(native.status())
    return backend == "cpu" or (backend == "auto" and available())


def _f32(name: str, t: torch.Tensor, last_contiguous: bool = True) -> None:
    if t.dtype != torch.float32 or t.device.type != "cpu":
        raise ValueError(f"{name} must be a float32 host tensor, got {t.dtype} on {t.device}")
    if last_contiguous and t.dim() and t.stride(-1) != 1:
        raise ValueError(f"{name} must be contiguous in its last dimension")


def add_rms_norm(x: torch.Tensor, delta: torch.Tensor | None, w: torch.Tensor, eps: float,
                 unit_offset: bool = False, *, backend: str = "auto") -> torch.Tensor:
    """``x`` ``[T, dim]`` += ``delta`` (in place, when given), then each row's RMSNorm times
    ``w`` (``1 + w`` with ``unit_offset``); ``[T, dim]``."""
    if not _cpu(backend):
        return ref.add_rms_norm(x, delta, w, eps, unit_offset)
    for name, t in (("x", x), ("w", w), *((("delta", delta),) if delta is not None else ())):
        _f32(name, t)
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous")
    if x.dim() != 2 or w.shape != (x.shape[1],) or (delta is not None and delta.shape != x.shape):
        raise ValueError(f"x [T, dim], w [dim] and delta [T, dim] must agree, got {tuple(x.shape)}, {tuple(w.shape)}")
    out = torch.empty_like(x)
    native.module().rw_add_rms_norm(x.data_ptr(), 0 if delta is None else delta.data_ptr(), w.data_ptr(),
                                    x.shape[0], x.shape[1], float(eps), bool(unit_offset), out.data_ptr())
    return out


def rope_table(positions: torch.Tensor, inv_freq: torch.Tensor, *,
               backend: str = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin ``[T, D/2]`` of ``positions`` ``[T]`` (int64) times ``inv_freq`` ``[D/2]``."""
    if not _cpu(backend):
        return ref.rope_table(positions, inv_freq)
    pos = positions.to(torch.int64).contiguous()
    inv = inv_freq.float().contiguous()
    cos = torch.empty(pos.shape[0], inv.shape[0])
    sin = torch.empty_like(cos)
    native.module().rw_rope_table(pos.data_ptr(), inv.data_ptr(), pos.shape[0], inv.shape[0], cos.data_ptr(),
                                  sin.data_ptr())
    return cos, sin


def _rows(name: str, t: torch.Tensor, rows: int, heads: int, d: int) -> int:
    """Checks a ``[T, heads, D]`` view whose heads are packed (row stride free); its row stride."""
    _f32(name, t)
    if t.dim() != 3 or tuple(t.shape) != (rows, heads, d) or (heads > 1 and t.stride(1) != d):
        raise ValueError(f"{name} must be [{rows}, {heads}, {d}] with packed heads, got {tuple(t.shape)}")
    return t.stride(0)


def _cache(name: str, t: torch.Tensor) -> None:
    _f32(name, t)
    if t.dim() != 4 or not t.is_contiguous():
        raise ValueError(f"{name} must be a contiguous [blocks, block_size, H_kv, D] cache")


def rope_append(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                slots: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, *,
                backend: str = "auto") -> torch.Tensor:
    """RoPE (the two halves of each head) on ``q`` ``[T, H, D]`` and ``k`` ``[T, Hkv, D]``
    (rows may be strided views of one fused product); rotated ``k`` and ``v`` go to cache slots
    ``slots`` ``[T]`` (int64, -1: not written) of ``k_cache``/``v_cache``
    ``[blocks, block_size, Hkv, D]``. Returns the rotated ``q``, contiguous."""
    if not _cpu(backend):
        return ref.rope_append(q, k, v, cos, sin, slots, k_cache, v_cache)
    t, h, d = q.shape
    hkv = k.shape[1] if k.dim() == 3 else 0
    qs, ks, vs = _rows("q", q, t, h, d), _rows("k", k, t, hkv, d), _rows("v", v, t, hkv, d)
    _cache("k_cache", k_cache)
    _cache("v_cache", v_cache)
    if k_cache.shape != v_cache.shape or tuple(k_cache.shape[2:]) != (hkv, d) or d % 2:
        raise ValueError(f"caches must be [blocks, block_size, {hkv}, {d}] alike, D even")
    for name, c in (("cos", cos), ("sin", sin)):
        _f32(name, c)
        if tuple(c.shape) != (t, d // 2) or not c.is_contiguous():
            raise ValueError(f"{name} must be contiguous [{t}, {d // 2}]")
    if slots.dtype != torch.int64 or slots.shape != (t,) or not slots.is_contiguous():
        raise ValueError(f"slots must be contiguous int64 [{t}]")
    if t and int(slots.max()) >= k_cache.shape[0] * k_cache.shape[1]:
        raise ValueError("a slot lies outside the cache")
    out = torch.empty(t, h, d)
    native.module().rw_rope_append(q.data_ptr(), qs, k.data_ptr(), ks, v.data_ptr(), vs, t, h, hkv, d, cos.data_ptr(),
                                   sin.data_ptr(), slots.data_ptr(), out.data_ptr(), k_cache.data_ptr(),
                                   v_cache.data_ptr())
    return out


def paged_attention_rows(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, table: torch.Tensor,
                         row_seq: torch.Tensor, row_pos: torch.Tensor, scale: float | None = None,
                         window: int | None = None, softcap: float | None = None, *, backend: str = "auto",
                         threads: int | None = None) -> torch.Tensor:
    """Causal attention of each query row r of ``q`` ``[T, H, D]`` (session ``row_seq[r]``,
    int32, at position ``row_pos[r]``, int64) over that session's cached positions
    ``0..row_pos[r]`` (the last ``window`` with a window), read through ``table``
    ``[B, max_blocks]`` (int32) from ``k_cache``/``v_cache`` ``[blocks, block_size, Hkv, D]``.
    Query head h reads KV head ``h // (H / Hkv)``; ``softcap``: scores become
    ``softcap * tanh(s / softcap)``. ``[T, H, D]``."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    if window is not None and int(window) < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    if softcap is not None and not float(softcap) > 0:
        raise ValueError(f"softcap must be > 0, got {softcap}")
    if not _cpu(backend):
        return ref.paged_attention_rows(q, k_cache, v_cache, table, row_seq, row_pos, scale, window, softcap)
    t, h, d = q.shape
    _rows("q", q, t, h, d)
    if not q.is_contiguous():
        raise ValueError("q must be contiguous")
    _cache("k_cache", k_cache)
    _cache("v_cache", v_cache)
    hkv = k_cache.shape[2]
    if k_cache.shape != v_cache.shape or k_cache.shape[3] != d or h % hkv:
        raise ValueError(f"caches must be [blocks, block_size, H_kv, {d}] alike with H a multiple of H_kv")
    if table.dtype != torch.int32 or table.dim() != 2 or not table.is_contiguous():
        raise ValueError("table must be a contiguous int32 [B, max_blocks]")
    if row_seq.dtype != torch.int32 or row_pos.dtype != torch.int64 or row_seq.shape != (t,) \
            or row_pos.shape != (t,) or not (row_seq.is_contiguous() and row_pos.is_contiguous()):
        raise ValueError(f"row_seq (int32) and row_pos (int64) must be contiguous [{t}]")
    if t and (int(row_seq.min()) < 0 or int(row_seq.max()) >= table.shape[0] or int(row_pos.min()) < 0
              or int(row_pos.max()) >= table.shape[1] * k_cache.shape[1]):
        raise ValueError("a row's session or position lies outside the block table")
    out = torch.empty(t, h, d)
    native.module().rw_attention(q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), k_cache.shape[1], h, hkv, d,
                                 table.data_ptr(), table.shape[1], row_seq.data_ptr(), row_pos.data_ptr(), t, scale,
                                 0 if window is None else int(window), 0.0 if softcap is None else float(softcap),
                                 out.data_ptr(), threads or torch.get_num_threads())
    return out


def gated_act(gate: torch.Tensor, up: torch.Tensor, act: str = "silu", *, backend: str = "auto") -> torch.Tensor:
    """``act(gate) * up`` for ``[T, F]`` views (row strides free: halves of one fused product);
    ``act``: ``silu`` or ``gelu_tanh``. ``[T, F]``, contiguous."""
    if act not in ACTS:
        raise ValueError(f"act must be one of {sorted(ACTS)}, not {act!r}")
    if not _cpu(backend):
        return ref.gated_act(gate, up, act)
    _f32("gate", gate)
    _f32("up", up)
    if gate.dim() != 2 or gate.shape != up.shape:
        raise ValueError(f"gate and up must be [T, F] alike, got {tuple(gate.shape)}, {tuple(up.shape)}")
    out = torch.empty(gate.shape)
    native.module().rw_gated_act(gate.data_ptr(), gate.stride(0), up.data_ptr(), up.stride(0), gate.shape[0],
                                 gate.shape[1], ACTS[act], out.data_ptr())
    return out


def linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None, *, backend: str = "auto",
           threads: int | None = None) -> torch.Tensor:
    """``x`` ``[T, K]`` times ``w`` ``[N, K]`` transposed (+ ``bias`` ``[N]``): ``[T, N]``."""
    if not _cpu(backend):
        return ref.linear(x, w, bias)
    _f32("x", x)
    _f32("w", w)
    if x.dim() != 2 or w.dim() != 2 or x.shape[1] != w.shape[1] or (bias is not None and bias.shape != (w.shape[0],)):
        raise ValueError(f"x [T, K], w [N, K], bias [N] must agree, got {tuple(x.shape)}, {tuple(w.shape)}")
    x, w = x.contiguous(), w.contiguous()
    if bias is not None:
        _f32("bias", bias)
        bias = bias.contiguous()
    out = torch.empty(x.shape[0], w.shape[0])
    native.module().rw_linear_f32(x.data_ptr(), x.shape[0], x.shape[1], w.data_ptr(), w.shape[0],
                                  0 if bias is None else bias.data_ptr(), out.data_ptr(),
                                  threads or torch.get_num_threads())
    return out
