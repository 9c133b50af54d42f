"""@triton.jit bodies of the sampling kernels; launchers: sdcp_fast/kernels/triton_backend.py.

Rows are split into vocabulary blocks of BLOCK ids, one program per (row, block), so a
small batch still fills the GPU; per-row results are combined by one program per row
in block order, so a row's result never depends on the rest of the batch.

Row statistics (arrays indexed by target row) define p under a profile:
``p(j) = kept(j) ? w(j) / norm : 0`` with ``w(j) = exp((l_j - lmax) / temp)``, or ``w = 1``
on a greedy (temperature 0) row; ``kept`` is every id unless the row is filtered, then the
ids ranked (logit desc, id asc) no later than ``(thr, thr_id)``.
"""

import triton
import triton.language as tl


@triton.jit
def _weights(logits_ptr, row, offs, mask, V, lmax, norm, temp, thr, thr_id, filtered, greedy):
    """p of ids ``offs`` of target row ``row`` (float32, 0 outside the kept set or past V)."""
    logit = tl.load(logits_ptr + row.to(tl.int64) * V + offs, mask=mask, other=float("-inf")).to(tl.float32)
    ranked_in = (logit > thr) | ((logit == thr) & (offs <= thr_id))
    w = tl.where(greedy != 0, 1.0, tl.exp((logit - lmax) / temp))
    w = tl.where(ranked_in, w, tl.where(filtered == 0, w, 0.0))
    return tl.where(mask, w / norm, 0.0)


@triton.jit
def row_partials_kernel(logits_ptr, temp_ptr, part_max_ptr, part_sum_ptr, part_arg_ptr, V, NBLK,
                        BLOCK: tl.constexpr):
    """Per (row, block): the block's max logit, its first argmax and sum of exp((logit - max) / temp)."""
    row = tl.program_id(0)
    blk = tl.program_id(1)
    offs = blk * BLOCK + tl.arange(0, BLOCK)
    mask = offs < V
    logit = tl.load(logits_ptr + row.to(tl.int64) * V + offs, mask=mask, other=float("-inf")).to(tl.float32)
    m = tl.max(logit, axis=0)
    arg = tl.min(tl.where((logit == m) & mask, offs, V), axis=0)
    temp = tl.load(temp_ptr + row)
    safe_m = tl.where(m == float("-inf"), 0.0, m)
    s = tl.sum(tl.where(mask, tl.exp((logit - safe_m) / temp), 0.0), axis=0)
    out = row * NBLK + blk
    tl.store(part_max_ptr + out, m)
    tl.store(part_sum_ptr + out, s)
    tl.store(part_arg_ptr + out, arg)


@triton.jit
def row_combine_kernel(part_max_ptr, part_sum_ptr, part_arg_ptr, temp_ptr, lmax_ptr, norm_ptr, argmax_ptr,
                       V, NBLK, NBLK_P2: tl.constexpr):
    """Per row: max, first argmax and normalizer from the block partials, in block order."""
    row = tl.program_id(0)
    k = tl.arange(0, NBLK_P2)
    mask = k < NBLK
    pm = tl.load(part_max_ptr + row * NBLK + k, mask=mask, other=float("-inf"))
    ps = tl.load(part_sum_ptr + row * NBLK + k, mask=mask, other=0.0)
    pa = tl.load(part_arg_ptr + row * NBLK + k, mask=mask, other=V)
    m = tl.max(pm, axis=0)
    arg = tl.min(tl.where(pm == m, pa, V), axis=0)
    temp = tl.load(temp_ptr + row)
    scale = tl.where(pm == float("-inf"), 0.0, tl.exp((pm - m) / temp))
    tl.store(lmax_ptr + row, m)
    tl.store(norm_ptr + row, tl.sum(ps * scale, axis=0))
    tl.store(argmax_ptr + row, arg)


@triton.jit
def profile_write_kernel(logits_ptr, lmax_ptr, norm_ptr, temp_ptr, thr_ptr, thr_id_ptr, filtered_ptr, greedy_ptr,
                         probs_ptr, V, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < V
    p = _weights(logits_ptr, row, offs, mask, V, tl.load(lmax_ptr + row), tl.load(norm_ptr + row),
                 tl.load(temp_ptr + row), tl.load(thr_ptr + row), tl.load(thr_id_ptr + row),
                 tl.load(filtered_ptr + row), tl.load(greedy_ptr + row))
    tl.store(probs_ptr + row.to(tl.int64) * V + offs, p, mask=mask)


@triton.jit
def greedy_accept_kernel(argmax_ptr, tokens_ptr, cu_ptr, accepted_ptr, emitted_ptr, WIDTH):
    """Rule 1 for one session per program, from the per-row first argmax."""
    b = tl.program_id(0)
    t0 = tl.load(cu_ptr + b)
    m = tl.load(cu_ptr + b + 1) - t0
    a = tl.zeros([], dtype=tl.int64)
    alive = tl.full([], 1, tl.int64)
    for i in range(0, m):
        best = tl.load(argmax_ptr + t0 + b + i)
        ok = (tl.load(tokens_ptr + t0 + i) == best).to(tl.int64) * alive
        tl.store(emitted_ptr + b * WIDTH + i, best.to(tl.int32), mask=ok != 0)
        a += ok
        alive = ok
    tl.store(emitted_ptr + b * WIDTH + a, tl.load(argmax_ptr + t0 + b + a).to(tl.int32))
    tl.store(accepted_ptr + b, a.to(tl.int32))


@triton.jit
def speculative_accept_kernel(logits_ptr, q_ptr, tokens_ptr, cu_ptr, u_ptr, lmax_ptr, norm_ptr, temp_ptr, thr_ptr,
                              thr_id_ptr, filtered_ptr, greedy_ptr, accepted_ptr, emitted_ptr, bad_ptr,
                              draw_row_ptr, draw_q_ptr, draw_u_ptr, V, WIDTH):
    """Rule 2's acceptance tests for one session per program; records which row to draw from.

    draw_q is the q row of the first rejected position, -1 to draw from p[M+1], -2 for a
    bad session (no draw). Reads q(x[i]) for all i first: no uniform is read for a bad session.
    """
    b = tl.program_id(0)
    t0 = tl.load(cu_ptr + b)
    m = tl.load(cu_ptr + b + 1) - t0
    nbad = tl.zeros([], dtype=tl.int64)
    for i in range(0, m):
        x = tl.load(tokens_ptr + t0 + i)
        q = tl.load(q_ptr + (t0 + i) * V + x)
        nbad += ((q > 0.0) & (q < float("inf"))).to(tl.int64) ^ 1
    a = tl.zeros([], dtype=tl.int64)
    alive = (nbad == 0).to(tl.int64)
    for i in range(0, m * alive):
        row = t0 + b + i
        x = tl.load(tokens_ptr + t0 + i)
        q = tl.load(q_ptr + (t0 + i) * V + x).to(tl.float64)
        p = _weights(logits_ptr, row, x, x < V, V, tl.load(lmax_ptr + row), tl.load(norm_ptr + row),
                     tl.load(temp_ptr + row), tl.load(thr_ptr + row), tl.load(thr_id_ptr + row),
                     tl.load(filtered_ptr + row), tl.load(greedy_ptr + row)).to(tl.float64)
        ratio = tl.minimum(p / q, 1.0)
        ok = (tl.load(u_ptr + (b * WIDTH + i) * 2) < ratio).to(tl.int64) * alive
        tl.store(emitted_ptr + b * WIDTH + i, x.to(tl.int32), mask=ok != 0)
        a += ok
        alive = ok
    tl.store(accepted_ptr + b, a.to(tl.int32))
    tl.store(bad_ptr + b, (nbad != 0).to(tl.int8))
    tl.store(draw_row_ptr + b, t0 + b + a)
    draw_q = tl.where(a < m, t0 + a, -1)
    tl.store(draw_q_ptr + b, tl.where(nbad != 0, -2, draw_q))
    tl.store(draw_u_ptr + b, tl.load(u_ptr + (b * WIDTH + a) * 2 + 1, mask=nbad == 0, other=0.0))


@triton.jit
def _draw_weights(src_ptr, q_ptr, row, qrow, offs, limit, V, lmax_ptr, norm_ptr, temp_ptr, thr_ptr, thr_id_ptr,
                  filtered_ptr, greedy_ptr, RAW: tl.constexpr):
    """Weights of ids ``offs``: row ``row`` of ``src`` as given (RAW), else the residual
    max(0, p - q[qrow]) of target row ``row`` (p itself when qrow < 0); 0 from ``limit`` on.

    Masks compare offs with a scalar limit: combining a block mask with a scalar test by
    `&` is not supported by the triton interpreter.
    """
    mask = offs < limit
    if RAW:
        w = tl.load(src_ptr + row.to(tl.int64) * V + offs, mask=mask, other=0.0)
    else:
        p = _weights(src_ptr, row, offs, mask, V, tl.load(lmax_ptr + row), tl.load(norm_ptr + row),
                     tl.load(temp_ptr + row), tl.load(thr_ptr + row), tl.load(thr_id_ptr + row),
                     tl.load(filtered_ptr + row), tl.load(greedy_ptr + row))
        q = tl.load(q_ptr + tl.maximum(qrow, 0).to(tl.int64) * V + offs, mask=offs < tl.where(qrow >= 0, limit, 0),
                    other=0.0)
        w = tl.maximum(p - q, 0.0)
    return w


@triton.jit
def draw_partials_kernel(src_ptr, q_ptr, draw_row_ptr, draw_q_ptr, lmax_ptr, norm_ptr, temp_ptr, thr_ptr,
                         thr_id_ptr, filtered_ptr, greedy_ptr, part_ptr, part_p_ptr, V, NBLK, BLOCK: tl.constexpr,
                         RAW: tl.constexpr):
    """Per (draw, block): block sums of the weights (raw, or residual max(0, p - q)) and of p."""
    d = tl.program_id(0)
    blk = tl.program_id(1)
    qrow = tl.load(draw_q_ptr + d)
    offs = blk * BLOCK + tl.arange(0, BLOCK)
    row = tl.load(draw_row_ptr + d)
    limit = tl.where(qrow > -2, V, 0)
    w = _draw_weights(src_ptr, q_ptr, row, qrow, offs, limit, V, lmax_ptr, norm_ptr, temp_ptr, thr_ptr,
                      thr_id_ptr, filtered_ptr, greedy_ptr, RAW)
    tl.store(part_ptr + d * NBLK + blk, tl.sum(w.to(tl.float64), axis=0))
    if not RAW:  # p's block sums, for a residual that rounding left without mass
        p = _draw_weights(src_ptr, q_ptr, row, qrow * 0 - 1, offs, limit, V, lmax_ptr, norm_ptr, temp_ptr, thr_ptr,
                          thr_id_ptr, filtered_ptr, greedy_ptr, RAW)
        tl.store(part_p_ptr + d * NBLK + blk, tl.sum(p.to(tl.float64), axis=0))


@triton.jit
def draw_select_kernel(src_ptr, q_ptr, draw_row_ptr, draw_q_ptr, draw_u_ptr, lmax_ptr, norm_ptr, temp_ptr, thr_ptr,
                       thr_id_ptr, filtered_ptr, greedy_ptr, part_ptr, part_p_ptr, out_ptr, V, NBLK,
                       BLOCK: tl.constexpr, RAW: tl.constexpr):
    """Inverse CDF: smallest id with cumulative weight (ascending ids) > u * total; -1 without mass.

    A residual without mass (p == q up to rounding) draws from p instead, as the reference does.
    Block totals (float64, in block order) locate the block; a scan inside it finds the id.
    If rounding leaves the scan short, the block's last positive id is taken.
    """
    d = tl.program_id(0)
    qrow = tl.load(draw_q_ptr + d)
    total = tl.zeros([], dtype=tl.float64)
    total_p = tl.zeros([], dtype=tl.float64)
    for k in range(0, NBLK):
        total += tl.load(part_ptr + d * NBLK + k)
        total_p += tl.load(part_p_ptr + d * NBLK + k)
    use_p = (total <= 0.0) & (qrow >= 0)
    qrow = tl.where(use_p, -1, qrow)
    total = tl.where(use_p, total_p, total)
    target = tl.load(draw_u_ptr + d) * total
    before = tl.zeros([], dtype=tl.float64)
    found = tl.zeros([], dtype=tl.int64)
    chosen = tl.zeros([], dtype=tl.int64)
    for k in range(0, NBLK):
        part = tl.where(use_p, tl.load(part_p_ptr + d * NBLK + k), tl.load(part_ptr + d * NBLK + k))
        hit = ((before + part > target) & (part > 0) & (found == 0)).to(tl.int64)
        chosen = tl.where(hit != 0, k, chosen)
        found += hit
        before += part * (found == 0).to(tl.float64)
    # no block crossed (rounding at the top end): the last block with mass
    for k in range(0, NBLK):
        part = tl.where(use_p, tl.load(part_p_ptr + d * NBLK + k), tl.load(part_ptr + d * NBLK + k))
        last = (found == 0) & (part > 0)
        chosen = tl.where(last, k, chosen)
    offs = chosen * BLOCK + tl.arange(0, BLOCK)
    w = _draw_weights(src_ptr, q_ptr, tl.load(draw_row_ptr + d), qrow, offs, tl.where(qrow > -2, V, 0), V,
                      lmax_ptr, norm_ptr, temp_ptr, thr_ptr, thr_id_ptr, filtered_ptr, greedy_ptr, RAW).to(tl.float64)
    c = tl.cumsum(w, axis=0) + before
    first = tl.min(tl.where((c > target) & (w > 0), offs, V), axis=0)
    first = tl.where(found != 0, first, V)
    last_pos = tl.max(tl.where(w > 0, offs, -1), axis=0)
    token = tl.where(first < V, first, last_pos)
    tl.store(out_ptr + d, tl.where((total > 0) & (qrow > -2), token, -1).to(tl.int32))
