"""Paged KV cache read/write.

Layout: ``cache[num_blocks, block_size, H, D]``, contiguous. Token slot
``s = block * block_size + offset`` addresses ``cache[block, offset]``; a session's
position ``i`` lives in block ``block_table[b, i // block_size]`` at offset
``i % block_size``.
"""

from __future__ import annotations

import torch

from . import backends, params


def write_paged_kv(cache: torch.Tensor, values: torch.Tensor, slot_mapping: torch.Tensor,
                   backend: str = "auto") -> None:
    """Scatter per-token K or V vectors into their cache slots, in place.

    Parameters
    ----------
    cache : torch.Tensor
        Shape: ``[num_blocks, block_size, H, D]``; dtype float32, bfloat16 or float16; contiguous.
    values : torch.Tensor
        Shape: ``[T, H, D]``; same dtype and device as ``cache``.
    slot_mapping : torch.Tensor
        Shape: ``[T]``; int64. ``slot_mapping[t] = block * block_size + offset`` receives
        ``values[t]``; a negative slot skips the token (padding). Non-negative slots must
        be distinct (which duplicate wins is unspecified) and below ``num_blocks * block_size``
        (a ValueError for CPU tensors; skipped without a host sync on CUDA).
    backend : str
        ``"auto"``, ``"reference"``, ``"cpu"`` or ``"triton"``.
    """
    params.paged_cache(cache)
    num_blocks, block_size, heads, dim = cache.shape
    if values.shape[1:] != (heads, dim) or values.dim() != 3 or values.dtype != cache.dtype:
        raise ValueError(f"values must be [T, {heads}, {dim}] {cache.dtype}, got {values.dtype} "
                         f"{tuple(values.shape)}")
    if slot_mapping.shape != (values.shape[0],) or slot_mapping.dtype != torch.int64:
        raise ValueError(f"slot_mapping must be int64 of shape [{values.shape[0]}], got "
                         f"{slot_mapping.dtype} {tuple(slot_mapping.shape)}")
    if values.device != cache.device or slot_mapping.device != cache.device:
        raise ValueError("cache, values and slot_mapping must be on one device")
    # Checked where it is free; on a GPU the check would cost a host sync per call (per layer),
    # so the kernel skips out-of-range slots instead of writing out of bounds.
    if cache.device.type == "cpu" and slot_mapping.numel() and int(slot_mapping.max()) >= num_blocks * block_size:
        raise ValueError(f"slot_mapping has a slot >= num_blocks * block_size = {num_blocks * block_size}")
    name = backends.resolve(backend, cache.device)
    backends.load(name).write_paged_kv(cache, values.contiguous(), slot_mapping.contiguous())


def gather_paged_kv(cache: torch.Tensor, block_table: torch.Tensor, seq_lens: torch.Tensor,
                    backend: str = "auto") -> torch.Tensor:
    """Read each session's positions ``0..seq_lens[b]-1`` through its block table.

    Parameters
    ----------
    cache : torch.Tensor
        Shape: ``[num_blocks, block_size, H, D]``; dtype float32, bfloat16 or float16; contiguous.
    block_table : torch.Tensor
        Shape: ``[B, max_blocks]``; int32. Entries past a session's last used block are not read.
    seq_lens : torch.Tensor
        Shape: ``[B]``; int32, each ``<= max_blocks * block_size``.
    backend : str
        ``"auto"``, ``"reference"``, ``"cpu"`` or ``"triton"``.

    Returns
    -------
    torch.Tensor
        Shape: ``[sum(seq_lens), H, D]``; dtype of ``cache``. Sessions concatenated in batch order.
    """
    params.paged_cache(cache)
    num_blocks, block_size = cache.shape[:2]
    if block_table.dim() != 2 or block_table.dtype != torch.int32:
        raise ValueError(f"block_table must be int32 [B, max_blocks], got {block_table.dtype} "
                         f"{tuple(block_table.shape)}")
    if seq_lens.shape != (block_table.shape[0],) or seq_lens.dtype != torch.int32:
        raise ValueError(f"seq_lens must be int32 of shape [{block_table.shape[0]}], got "
                         f"{seq_lens.dtype} {tuple(seq_lens.shape)}")
    if block_table.device != cache.device or seq_lens.device != cache.device:
        raise ValueError("cache, block_table and seq_lens must be on one device")
    if seq_lens.numel() and (int(seq_lens.min()) < 0
                             or int(seq_lens.max()) > block_table.shape[1] * block_size):
        raise ValueError(f"seq_lens must lie in [0, max_blocks * block_size = "
                         f"{block_table.shape[1] * block_size}]")
    name = backends.resolve(backend, cache.device)
    return backends.load(name).gather_paged_kv(cache, block_table.contiguous(), seq_lens.contiguous())
