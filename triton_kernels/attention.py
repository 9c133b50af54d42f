"""@triton.jit body of paged attention; launcher: sdcp_fast/kernels/triton_backend.py.

One program per (query row, KV head): it reads the session's K and V through the block table,
one cache block at a time (no gather of the cache into a new tensor), for the GROUP query
heads that share the KV head, with an online softmax in float32. Decode is one query row
per session; a verify pass brings M + 1 rows, each causal up to its own position. With a
sliding window a row reads only the blocks that hold its last WINDOW keys; soft-capped scores
are ``CAP * tanh(s / CAP)``.
"""

import triton
import triton.language as tl


@triton.jit
def paged_attention_kernel(q_ptr, k_ptr, v_ptr, table_ptr, seq_lens_ptr, cu_q_ptr, out_ptr, scale, B, MAX_BLOCKS,
                           H, HKV, D, WINDOW, CAP, WINDOWED: tl.constexpr, CAPPED: tl.constexpr,
                           GROUP: tl.constexpr, GROUP_P2: tl.constexpr, D_P2: tl.constexpr,
                           BS: tl.constexpr, BS_P2: tl.constexpr, LOG_B: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    g = tl.program_id(1).to(tl.int64)
    # the session of query row t: the largest b with cu_q[b] <= t
    lo = tl.zeros([], dtype=tl.int64)
    hi = lo + B
    for _ in tl.static_range(LOG_B):
        mid = (lo + hi) // 2
        go = tl.load(cu_q_ptr + mid).to(tl.int64) <= t
        lo = tl.where(go, mid, lo)
        hi = tl.where(go, hi, mid)
    b = lo
    q0 = tl.load(cu_q_ptr + b).to(tl.int64)
    q_len = tl.load(cu_q_ptr + b + 1).to(tl.int64) - q0
    n_keys = tl.load(seq_lens_ptr + b).to(tl.int64) - q_len + (t - q0) + 1  # causal: keys 0..position
    first = tl.zeros([], dtype=tl.int64)
    if WINDOWED:
        first = tl.maximum(first, n_keys - WINDOW)  # the window's first key
    heads = g * GROUP + tl.arange(0, GROUP_P2)
    d = tl.arange(0, D_P2)
    head_ok = tl.arange(0, GROUP_P2) < GROUP
    q_mask = head_ok[:, None] & (d < D)[None, :]
    q = tl.load(q_ptr + (t * H + heads[:, None]) * D + d[None, :], mask=q_mask, other=0.0).to(tl.float32)
    q = q * scale
    m = tl.full([GROUP_P2], float("-inf"), tl.float32)
    den = tl.zeros([GROUP_P2], dtype=tl.float32)
    acc = tl.zeros([GROUP_P2, D_P2], dtype=tl.float32)
    s = tl.arange(0, BS_P2)
    for kb in range(first // BS, tl.cdiv(n_keys, BS)):
        block = tl.load(table_ptr + b * MAX_BLOCKS + kb).to(tl.int64)
        pos = kb * BS + s
        live = (pos < n_keys) & (pos >= first) & (s < BS)
        kv_mask = live[:, None] & (d < D)[None, :]
        offs = ((block * BS + s[:, None]) * HKV + g) * D + d[None, :]  # [BS_P2, D_P2]
        k = tl.load(k_ptr + offs, mask=kv_mask, other=0.0).to(tl.float32)
        v = tl.load(v_ptr + offs, mask=kv_mask, other=0.0).to(tl.float32)
        scores = tl.sum(q[:, None, :] * k[None, :, :], axis=2)  # [GROUP_P2, BS_P2]
        if CAPPED:  # CAP * tanh(s / CAP), tanh(x) = 1 - 2 / (exp(2x) + 1)
            scores = CAP * (1.0 - 2.0 / (tl.exp(2.0 * scores / CAP) + 1.0))
        scores = tl.where(live[None, :], scores, float("-inf"))
        m_new = tl.maximum(m, tl.max(scores, axis=1))
        alpha = tl.exp(m - m_new)
        p = tl.exp(scores - m_new[:, None])
        den = den * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v[None, :, :], axis=1)
        m = m_new
    out = acc / den[:, None]
    tl.store(out_ptr + (t * H + heads[:, None]) * D + d[None, :], out.to(out_ptr.dtype.element_ty), mask=q_mask)
