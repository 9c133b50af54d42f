"""@triton.jit bodies of the paged KV copies; launchers: sdcp_fast/kernels/triton_backend.py."""

import triton
import triton.language as tl


@triton.jit
def write_kernel(cache_ptr, values_ptr, slots_ptr, ROW, CAPACITY, BLOCK: tl.constexpr):
    """cache row ``slots[t]`` = values row t (ROW elements), skipped when the slot is negative
    or not below CAPACITY (the launcher does not check on the GPU: that would need a host sync)."""
    t = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    slot = tl.load(slots_ptr + t)
    mask = offs < tl.where((slot >= 0) & (slot < CAPACITY), ROW, 0)  # a block mask from a scalar test
    v = tl.load(values_ptr + t.to(tl.int64) * ROW + offs, mask=mask)
    tl.store(cache_ptr + tl.maximum(slot, 0) * ROW + offs, v, mask=mask)


@triton.jit
def gather_kernel(cache_ptr, slots_ptr, out_ptr, ROW, BLOCK: tl.constexpr):
    """out row i = cache row ``slots[i]``."""
    i = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < ROW
    slot = tl.load(slots_ptr + i)
    tl.store(out_ptr + i.to(tl.int64) * ROW + offs, tl.load(cache_ptr + slot * ROW + offs, mask=mask), mask=mask)
