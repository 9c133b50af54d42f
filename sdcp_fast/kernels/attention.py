"""Paged attention: each session's query rows attend to its cached keys, read through the block table."""

from __future__ import annotations

import math

import torch

from . import backends, params


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
                    seq_lens: torch.Tensor, cu_q: torch.Tensor, scale: float | None = None,
                    backend: str = "auto", window: int | None = None, softcap: float | None = None) -> torch.Tensor:
    """Causal attention over a paged KV cache (decode: one query row per session; a verify pass: M + 1).

    Query row i of session b (rows ``cu_q[b]:cu_q[b+1]``) sits at position
    ``seq_lens[b] - q_len_b + i`` and attends to the session's positions 0..that position,
    read from block ``block_table[b, j // block_size]``, offset ``j % block_size``. The new
    rows' K and V must already be written (:func:`write_paged_kv`). Query head h reads KV head
    ``h // (H / H_kv)`` (grouped-query attention). With a sliding ``window`` a row at position p
    sees only positions > p - window (its last ``window`` keys). With ``softcap`` each score s
    (q.k times scale) becomes ``softcap * tanh(s / softcap)`` before the softmax. The triton backend reads K and V in place,
    one cache block at a time, and reads nothing on the host; other backends use the reference.

    Parameters
    ----------
    q : torch.Tensor
        Shape: ``[T, H, D]``; float32, bfloat16 or float16; sessions' rows concatenated.
    k_cache, v_cache : torch.Tensor
        Shape: ``[num_blocks, block_size, H_kv, D]``; contiguous; H divisible by H_kv.
    block_table : torch.Tensor
        Shape: ``[B, max_blocks]``; integer.
    seq_lens : torch.Tensor
        Shape: ``[B]``; integer; cached positions including the new rows (>= q_len_b).
    cu_q : torch.Tensor
        Shape: ``[B + 1]``; integer; ``cu_q[0] = 0``, non-decreasing, ``cu_q[B] = T``.
    scale : float, optional
        Multiplies q.k; default ``1 / sqrt(D)``.
    backend : str
        ``"auto"``, ``"reference"``, ``"cpu"`` (the reference) or ``"triton"``.
    window : int, optional
        Sliding window (>= 1): keys per query row, its own included; default: every earlier key.
    softcap : float, optional
        Score soft-capping (> 0); default: none.

    Returns
    -------
    torch.Tensor
        Shape: ``[T, H, D]``; q's dtype.
    """
    params.paged_cache(k_cache)
    params.paged_cache(v_cache)
    if k_cache.shape != v_cache.shape or k_cache.dtype != v_cache.dtype:
        raise ValueError("k_cache and v_cache must have one shape and dtype")
    if q.dim() != 3 or q.shape[2] != k_cache.shape[3] or q.shape[1] % k_cache.shape[2] != 0:
        raise ValueError(f"q must be [T, H, D] with D = {k_cache.shape[3]} and H a multiple of "
                         f"H_kv = {k_cache.shape[2]}, got {tuple(q.shape)}")
    if q.dtype not in params.KV_DTYPES:
        raise ValueError(f"q must be float32, bfloat16 or float16, got {q.dtype}")
    batch = block_table.shape[0]
    if block_table.dim() != 2 or seq_lens.shape != (batch,) or cu_q.shape != (batch + 1,):
        raise ValueError(f"block_table [B, max_blocks], seq_lens [B] and cu_q [B + 1] must agree, got "
                         f"{tuple(block_table.shape)}, {tuple(seq_lens.shape)}, {tuple(cu_q.shape)}")
    if params.on_host(cu_q) and (int(cu_q[0]) != 0 or int(cu_q[-1]) != q.shape[0]
                                  or bool((cu_q[1:] < cu_q[:-1]).any())):
        raise ValueError("cu_q must start at 0, be non-decreasing and end at T")
    if window is not None and int(window) < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    if softcap is not None and not float(softcap) > 0:
        raise ValueError(f"softcap must be > 0, got {softcap}")
    scale = 1.0 / math.sqrt(q.shape[2]) if scale is None else float(scale)
    name = backends.resolve(backend, q.device)
    if name == "triton":
        from . import triton_backend

        return triton_backend.paged_attention(q.contiguous(), k_cache, v_cache, block_table, seq_lens, cu_q, scale,
                                              window, softcap)
    from . import reference

    return reference.paged_attention(q, k_cache, v_cache, block_table, seq_lens, cu_q, scale, window, softcap)
