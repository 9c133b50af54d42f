"""@triton.jit bodies of the sampling kernels; launchers: sdcp_fast/kernels/triton_backend.py.

Every entry point is one or two launches and reads nothing on the host: the ragged layout
(``cu``), the per-row profile and the uniforms are device memory, and what a host check
would have rejected comes back as a flag (``bad``, accepted -1, or NaN probabilities).

Pass 1 (``row_partials_kernel``, grid rows x splits): each program reads a fixed span of a
row (the span depends on V only, so a row's result never depends on its batch) and writes
the span's max, first argmax and sum of exp((l - max) / T). Rows under top-k/top-p are
searched whole by their split-0 program instead (``_search``): their kept set is found by
pivot search on an order-preserving integer key of the logit, never by sorting; the other
splits of such a row write neutral partials. Pass 2 combines the partials of each row it
needs (a handful of loads) and does the rest.

Row statistics define p under a profile: ``p(j) = kept(j) ? w(j) / norm : 0`` with
``w(j) = exp((l_j - lmax) / temp)``, or ``w = 1`` on a greedy (temperature 0) row; ``kept``
is every id unless the row is filtered, then the ids ranked (logit desc, id asc) no later
than ``(thr, thr_id)``.
"""

import triton
import triton.language as tl

NEG_INF = tl.constexpr(float("-inf"))
FLT_MIN = tl.constexpr(1.1754943508222875e-38)  # float32's smallest normal number


@triton.jit
def _param(ptr, idx, stride, scalar, PER_ROW: tl.constexpr):
    """A profile parameter: entry ``idx`` of a device tensor, or the launch's scalar."""
    if PER_ROW:
        value = tl.load(ptr + idx * stride).to(tl.int64)
    else:
        value = scalar + tl.zeros([], dtype=tl.int64)
    return value


@triton.jit
def _profile(tm, tk, tp, V):
    """(temp, greedy, top_k, top_p_milli, invalid) of one row; disabled filters are 0.

    A negative entry is invalid (only device tensors reach here unchecked); such a row is
    computed as plain softmax and its caller flags it."""
    invalid = (tm < 0) | (tk < 0) | (tp < 0)
    greedy = (tm == 0) & (~invalid)
    temp = tl.where(greedy | invalid, 1.0, tm.to(tl.float32) / 1000.0)
    k = tl.where((tk >= V) | invalid, 0, tk)
    p = tl.where((tp >= 1000) | invalid, 0, tp)
    return temp, greedy, k, p, invalid


@triton.jit
def _row_profile(s, tm_ptr, tm_stride, tm, tk_ptr, tk_stride, tk, tp_ptr, tp_stride, tp, V,
                 T_ROW: tl.constexpr, K_ROW: tl.constexpr, P_ROW: tl.constexpr):
    return _profile(_param(tm_ptr, s, tm_stride, tm, T_ROW), _param(tk_ptr, s, tk_stride, tk, K_ROW),
                    _param(tp_ptr, s, tp_stride, tp, P_ROW), V)


@triton.jit
def _session_of(cu_ptr, row, B, LOG_B: tl.constexpr):
    """The session owning target row ``row``: the largest b with cu[b] + b <= row."""
    lo = tl.zeros([], dtype=tl.int64)
    hi = lo + B
    for _ in tl.static_range(LOG_B):
        mid = (lo + hi) // 2
        go = tl.load(cu_ptr + mid).to(tl.int64) + mid <= row
        lo = tl.where(go, mid, lo)
        hi = tl.where(go, hi, mid)
    return lo


@triton.jit
def _key(x):
    """Order-preserving int64 of float32 values: x > y iff key(x) > key(y) (-0.0 counts as +0.0)."""
    x = tl.where(x == 0.0, 0.0, x)
    bits = x.to(tl.int32, bitcast=True)
    return (bits ^ ((bits >> 31) & 0x7FFFFFFF)).to(tl.int64)


@triton.jit
def _unkey(k):
    bits = k.to(tl.int32)
    return (bits ^ ((bits >> 31) & 0x7FFFFFFF)).to(tl.float32, bitcast=True)


@triton.jit
def _load_row(base, offs, lim):
    return tl.load(base + offs, mask=offs < lim, other=NEG_INF).to(tl.float32)


@triton.jit
def _pivots(lo, hi, NPIV: tl.constexpr):
    """NPIV keys spread over [lo, hi); at least one lies strictly inside when hi - lo >= 2."""
    j = tl.arange(0, NPIV).to(tl.int64)
    return lo + ((hi - lo) * (j + 1)) // (NPIV + 1)


@triton.jit
def _search(base, V, lmax, temp, k, p, BLOCK: tl.constexpr, NPIV: tl.constexpr):
    """Kept set of a top-k/top-p row: (thr, thr_id, norm) in the reference's terms.

    Top-k: the key kk of the k-th ranked id is the largest t with #{key >= t} >= k; c_k of
    the ids tied at kk are kept (the smallest ids). Top-p with limit P (top_p x the mass
    kept by top-k): the last kept value is the smallest key t >= kk with mass(key > t) < P,
    and of its ties, those whose preceding mass is < P. Each search pass evaluates NPIV
    pivots over the whole row, narrowing the key range NPIV + 1 fold.
    """
    kmin = tl.full([], 0x7FFFFFFF, tl.int64)
    for start in range(0, V, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        kmin = tl.minimum(kmin, tl.min(tl.where(offs < V, _key(_load_row(base, offs, V)), 0x7FFFFFFF), axis=0))
    kmax = _key(lmax)
    # top-k: g(t) = #{key >= t} >= k holds at lo, fails at hi; cnt_hi = #{key >= hi}
    lo = kmin
    hi = tl.where(k > 0, kmax + 1, kmin + 1)
    cnt_hi = tl.zeros([], dtype=tl.int64)
    while hi - lo > 1:
        piv = _pivots(lo, hi, NPIV)
        cnt = tl.zeros([NPIV], dtype=tl.int64)
        for start in range(0, V, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            key = _key(_load_row(base, offs, V))
            ge = (key[:, None] >= piv[None, :]) & (offs < V)[:, None]
            cnt += tl.sum(ge.to(tl.int64), axis=0)
        ok = cnt >= k
        lo = tl.maximum(lo, tl.max(tl.where(ok, piv, lo), axis=0))
        new_hi = tl.min(tl.where(ok, hi, piv), axis=0)
        cnt_hi = tl.where(new_hi < hi, tl.max(tl.where((~ok) & (piv == new_hi), cnt, -1), axis=0), cnt_hi)
        hi = new_hi
    kk = lo  # kmin when top-k is off: every id is kept by it
    c_k = tl.where(k > 0, k - cnt_hi, V)
    # mass above kk, and the total mass top-k keeps
    above = tl.zeros([], dtype=tl.float64)
    for start in range(0, V, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        x = _load_row(base, offs, V)
        w = tl.where((_key(x) > kk) & (offs < V), tl.exp((x - lmax) / temp), 0.0)
        above += tl.sum(w, axis=0).to(tl.float64)
    w_kk = tl.exp((_unkey(kk) - lmax) / temp).to(tl.float64)
    thr_key = kk
    mass_at = above
    c = c_k
    if p > 0:
        # top-p: h(t) = mass(key > t) < limit fails at lo (by fiat: the answer is >= kk), holds at hi
        n_kk = tl.zeros([], dtype=tl.int64)
        for start in range(0, V, BLOCK):  # ties at kk (what top-k keeps of them is c_k)
            offs = start + tl.arange(0, BLOCK)
            n_kk += tl.sum(((_key(_load_row(base, offs, V)) == kk) & (offs < V)).to(tl.int64), axis=0)
        limit = p.to(tl.float64) / 1000.0 * (above + tl.minimum(c_k, n_kk).to(tl.float64) * w_kk)
        lo = kk - 1
        hi = kmax
        mass_hi = tl.zeros([], dtype=tl.float64)
        while hi - lo > 1:
            piv = _pivots(lo, hi, NPIV)
            mass = tl.zeros([NPIV], dtype=tl.float64)
            for start in range(0, V, BLOCK):
                offs = start + tl.arange(0, BLOCK)
                x = _load_row(base, offs, V)
                w = tl.where(offs < V, tl.exp((x - lmax) / temp), 0.0)
                gt = _key(x)[:, None] > piv[None, :]
                mass += tl.sum(tl.where(gt, w[:, None], 0.0), axis=0).to(tl.float64)
            ok = mass < limit
            new_hi = tl.min(tl.where(ok, piv, hi), axis=0)
            mass_hi = tl.where(new_hi < hi, tl.max(tl.where(ok & (piv == new_hi), mass, -1.0), axis=0), mass_hi)
            hi = new_hi
            lo = tl.maximum(lo, tl.max(tl.where(ok, lo, piv), axis=0))
        thr_key = hi
        mass_at = mass_hi
        w_t = tl.exp((_unkey(hi) - lmax) / temp).to(tl.float64)
        # ties at the last value: the i-th (0-based) is kept iff mass_at + i * w_t < limit
        c_p = tl.where(w_t > 0.0, tl.ceil((limit - mass_at) / tl.where(w_t > 0.0, w_t, 1.0)), 1.0 * V)
        c_p = tl.maximum(tl.minimum(c_p, 1.0 * V), 1.0).to(tl.int64)
        c = tl.where(hi == kk, tl.minimum(c_p, c_k), c_p)
    # thr_id: the c-th smallest id among the ties at thr_key (the last one when there are fewer)
    thr_id = tl.full([], -1, tl.int64)
    seen = tl.zeros([], dtype=tl.int64)
    for start in range(0, V, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        tie = (_key(_load_row(base, offs, V)) == thr_key) & (offs < V)
        rank = tl.cumsum(tie.to(tl.int64), axis=0) + seen
        thr_id = tl.maximum(thr_id, tl.max(tl.where(tie & (rank <= c), offs, -1), axis=0))
        seen += tl.sum(tie.to(tl.int64), axis=0)
    thr = _unkey(thr_key)
    norm = mass_at + tl.minimum(c, seen).to(tl.float64) * tl.exp((thr - lmax) / temp).to(tl.float64)
    return thr, thr_id, norm


@triton.jit
def row_partials_kernel(logits_ptr, part_max_ptr, part_sum_ptr, part_arg_ptr, thr_ptr, thr_id_ptr, cu_ptr,
                        tm_ptr, tm_stride, tm, tk_ptr, tk_stride, tk, tp_ptr, tp_stride, tp,
                        V, B, NSPLIT, CHUNK,
                        BLOCK: tl.constexpr, LOG_B: tl.constexpr, SESSION_ROWS: tl.constexpr,
                        T_ROW: tl.constexpr, K_ROW: tl.constexpr, P_ROW: tl.constexpr,
                        EXP: tl.constexpr, SEARCH: tl.constexpr, NPIV: tl.constexpr):
    """Pass 1, per (row, split): max, first argmax and sum of exp((l - max) / temp) over the
    split's CHUNK blocks (EXP off: max and argmax only). Filtered rows: see the module doc."""
    row = tl.program_id(0).to(tl.int64)
    split = tl.program_id(1)
    if SESSION_ROWS:
        s = _session_of(cu_ptr, row, B, LOG_B)
    else:
        s = row
    temp, greedy, k, p, invalid = _row_profile(s, tm_ptr, tm_stride, tm, tk_ptr, tk_stride, tk, tp_ptr, tp_stride,
                                               tp, V, T_ROW, K_ROW, P_ROW)
    base = logits_ptr + row * V
    out = row * NSPLIT + split
    searched = (~greedy) & ((k > 0) | (p > 0))
    if not SEARCH:
        searched = searched & False
    # a searched row's span work is done by its split 0 over the whole row: others skip theirs
    lim = tl.where(searched, 0, V)
    m = tl.full([], NEG_INF, tl.float32)
    acc = tl.zeros([], dtype=tl.float32)
    arg = tl.zeros([], dtype=tl.int64) + V
    for c in range(0, CHUNK):
        offs = (split * CHUNK + c) * BLOCK + tl.arange(0, BLOCK)
        x = _load_row(base, offs, lim)
        bm = tl.max(x, axis=0)
        barg = tl.min(tl.where((x == bm) & (offs < lim), offs, V), axis=0)
        arg = tl.where(bm > m, barg, arg)
        new_m = tl.maximum(m, bm)
        if EXP:
            safe = tl.where(new_m == NEG_INF, 0.0, new_m)
            acc = acc * tl.where(m == NEG_INF, 0.0, tl.exp((m - safe) / temp)) + tl.sum(
                tl.exp((x - safe) / temp), axis=0)
        m = new_m
    if SEARCH:
        if searched & (split == 0):
            for start in range(0, V, BLOCK):
                offs = start + tl.arange(0, BLOCK)
                x = _load_row(base, offs, V)
                bm = tl.max(x, axis=0)
                barg = tl.min(tl.where((x == bm) & (offs < V), offs, V), axis=0)
                arg = tl.where(bm > m, barg, arg)
                m = tl.maximum(m, bm)
            thr, thr_id, norm = _search(base, V, m, temp, k, p, BLOCK, NPIV)
            acc = norm.to(tl.float32)
            tl.store(thr_ptr + row, thr)
            tl.store(thr_id_ptr + row, thr_id)
    tl.store(part_max_ptr + out, m)
    tl.store(part_arg_ptr + out, arg.to(tl.int32))
    if EXP:
        tl.store(part_sum_ptr + out, acc)


@triton.jit
def _stats(part_max_ptr, part_sum_ptr, part_arg_ptr, thr_ptr, thr_id_ptr, row, NSPLIT, temp, greedy, searched, V,
           NSPLIT_P2: tl.constexpr):
    """(lmax, norm, thr, thr_id, filtered, argmax) of one row from its pass-1 partials, in split order."""
    i = tl.arange(0, NSPLIT_P2)
    base = row * NSPLIT
    pm = tl.load(part_max_ptr + base + i, mask=i < NSPLIT, other=NEG_INF)
    ps = tl.load(part_sum_ptr + base + i, mask=i < NSPLIT, other=0.0)
    pa = tl.load(part_arg_ptr + base + i, mask=i < NSPLIT, other=V)
    m = tl.max(pm, axis=0)
    arg = tl.min(tl.where(pm == m, pa, V), axis=0).to(tl.int64)
    scale = tl.where(pm == NEG_INF, 0.0, tl.exp((pm - m) / temp))
    norm = tl.where(greedy, 1.0, tl.sum(ps * scale, axis=0))
    thr = tl.where(searched, tl.load(thr_ptr + row, mask=searched, other=0.0), m)
    thr_id = tl.where(searched, tl.load(thr_id_ptr + row, mask=searched, other=0), arg)
    return m, norm, thr, thr_id, greedy | searched, arg


@triton.jit
def _probs(x, offs, lmax, norm, temp, thr, thr_id, filtered, greedy):
    """p of logits ``x`` at ids ``offs`` (float32; masked-off ids carry -inf, hence 0 unless greedy)."""
    kept = (~filtered) | (x > thr) | ((x == thr) & (offs <= thr_id))
    w = tl.where(greedy, 1.0, tl.exp((x - lmax) / temp))
    return tl.where(kept, w / norm, 0.0)


@triton.jit
def profile_write_kernel(logits_ptr, part_max_ptr, part_sum_ptr, part_arg_ptr, thr_ptr, thr_id_ptr, probs_ptr,
                         tm_ptr, tm_stride, tm, tk_ptr, tk_stride, tk, tp_ptr, tp_stride, tp, V, NSPLIT, CHUNK,
                         BLOCK: tl.constexpr, NSPLIT_P2: tl.constexpr, T_ROW: tl.constexpr, K_ROW: tl.constexpr,
                         P_ROW: tl.constexpr, SEARCH: tl.constexpr):
    """Pass 2 of apply_sampling_profile, per (row, split): p of the split's ids; NaN on an invalid row."""
    row = tl.program_id(0).to(tl.int64)
    split = tl.program_id(1)
    temp, greedy, k, p, invalid = _row_profile(row, tm_ptr, tm_stride, tm, tk_ptr, tk_stride, tk, tp_ptr, tp_stride,
                                               tp, V, T_ROW, K_ROW, P_ROW)
    searched = (~greedy) & ((k > 0) | (p > 0))
    if not SEARCH:
        searched = searched & False
    lmax, norm, thr, thr_id, filtered, _ = _stats(part_max_ptr, part_sum_ptr, part_arg_ptr, thr_ptr, thr_id_ptr,
                                                  row, NSPLIT, temp, greedy, searched, V, NSPLIT_P2)
    for c in range(0, CHUNK):
        offs = (split * CHUNK + c) * BLOCK + tl.arange(0, BLOCK)
        x = _load_row(logits_ptr + row * V, offs, V)
        prob = _probs(x, offs, lmax, norm, temp, thr, thr_id, filtered, greedy)
        prob = tl.where(prob < FLT_MIN, 0.0, prob)  # the reference's rule for subnormal probabilities
        prob = tl.where(invalid, float("nan"), prob)
        tl.store(probs_ptr + row * V + offs, prob, mask=offs < V)


@triton.jit
def _draw_weights(src_ptr, row, q_ptr, qrow, offs, lim, V, lmax, norm, temp, thr, thr_id, filtered, greedy,
                  RAW: tl.constexpr):
    """(weights, p) at ids ``offs`` below ``lim``: RAW, row ``row`` of ``src`` as given (twice);
    else the residual max(0, p - q[qrow]) of target row ``row`` (p itself when qrow < 0) and p."""
    if RAW:
        w = tl.load(src_ptr + row * V + offs, mask=offs < lim, other=0.0)
        pw = w
    else:
        x = _load_row(src_ptr + row * V, offs, lim)
        pw = tl.where(offs < lim, _probs(x, offs, lmax, norm, temp, thr, thr_id, filtered, greedy), 0.0)
        q = tl.load(q_ptr + tl.maximum(qrow, 0) * V + offs, mask=offs < tl.where(qrow >= 0, lim, 0), other=0.0)
        w = tl.maximum(pw - q, 0.0)
    return w, pw


@triton.jit
def _inverse_cdf(src_ptr, row, q_ptr, qrow, u, active, V, lmax, norm, temp, thr, thr_id, filtered, greedy,
                 scratch_ptr, BLOCK: tl.constexpr, NBLK_P2: tl.constexpr, RAW: tl.constexpr):
    """The one inverse-CDF rule: smallest id with cumulative weight (ascending ids) > u * total;
    the largest positive id if rounding leaves none; -1 without mass (or when not ``active``).

    A residual without mass (p == q up to rounding) draws from p instead, as the reference
    does. One read of the row (block sums in float64 to ``scratch``: 2 x NBLK_P2 entries, each
    block's sum the last entry of its scan), a scan of the block sums, then one block re-read.
    """
    lim = tl.where(active, V, 0)
    last_w = tl.full([], -1, tl.int64)
    last_p = tl.full([], -1, tl.int64)
    for start in range(0, V, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        w, pw = _draw_weights(src_ptr, row, q_ptr, qrow, offs, lim, V, lmax, norm, temp, thr, thr_id, filtered,
                              greedy, RAW)
        tl.store(scratch_ptr + start // BLOCK, tl.max(tl.cumsum(w.to(tl.float64), axis=0), axis=0))
        tl.store(scratch_ptr + NBLK_P2 + start // BLOCK, tl.max(tl.cumsum(pw.to(tl.float64), axis=0), axis=0))
        last_w = tl.maximum(last_w, tl.max(tl.where(w > 0.0, offs, -1), axis=0))
        last_p = tl.maximum(last_p, tl.max(tl.where(pw > 0.0, offs, -1), axis=0))
    tl.debug_barrier()  # the block sums were stored by other threads of this program
    k = tl.arange(0, NBLK_P2)
    nblk = tl.cdiv(V, BLOCK)
    parts_w = tl.load(scratch_ptr + k, mask=k < nblk, other=0.0)
    parts_p = tl.load(scratch_ptr + NBLK_P2 + k, mask=k < nblk, other=0.0)
    use_p = tl.max(parts_w, axis=0) <= 0.0
    c = tl.cumsum(tl.where(use_p, parts_p, parts_w), axis=0)
    total = tl.max(c, axis=0)
    target = u * total
    blk = tl.min(tl.where(c > target, k, NBLK_P2), axis=0)
    before = tl.max(tl.where(k < blk, c, 0.0), axis=0)
    offs = blk * BLOCK + tl.arange(0, BLOCK)
    w, pw = _draw_weights(src_ptr, row, q_ptr, qrow, offs, tl.where(blk < nblk, lim, 0), V, lmax, norm, temp, thr,
                          thr_id, filtered, greedy, RAW)
    w = tl.where(use_p, pw, w).to(tl.float64)
    cw = tl.cumsum(w, axis=0) + before
    token = tl.min(tl.where(cw > target, offs, V), axis=0).to(tl.int64)
    # rounding at a block's end: its last positive id; past the last block: the row's
    token = tl.where(token < V, token, tl.max(tl.where(w > 0.0, offs, -1), axis=0).to(tl.int64))
    token = tl.where(blk < nblk, token, tl.where(use_p, last_p, last_w))
    return tl.where(active & (total > 0.0), token, -1)


@triton.jit
def sample_kernel(probs_ptr, u_ptr, out_ptr, scratch_ptr, V, BLOCK: tl.constexpr, NBLK_P2: tl.constexpr):
    """sample_from_probs: one inverse-CDF draw per row."""
    row = tl.program_id(0).to(tl.int64)
    active = tl.full([], 1, tl.int1)
    zero = tl.zeros([], dtype=tl.float32)
    token = _inverse_cdf(probs_ptr, row, probs_ptr, row, tl.load(u_ptr + row), active, V, zero, zero, zero, zero,
                         row, active, active, scratch_ptr + row * 2 * NBLK_P2, BLOCK, NBLK_P2, True)
    tl.store(out_ptr + row, token.to(tl.int32))


@triton.jit
def _layout(cu_ptr, b, B, D, W):
    """(t0, M_b, ok) of session b; a layout a host check would reject gives ok false and M_b 0."""
    t0 = tl.load(cu_ptr + b).to(tl.int64)
    t1 = tl.load(cu_ptr + b + 1).to(tl.int64)
    ok = (tl.load(cu_ptr).to(tl.int64) == 0) & (tl.load(cu_ptr + B).to(tl.int64) == D)
    ok = ok & (t0 >= 0) & (t1 >= t0) & (t1 <= D) & (t1 - t0 < W)
    return tl.where(ok, t0, 0), tl.where(ok, t1 - t0, 0), ok


@triton.jit
def _write_emitted(emitted_ptr, tokens_ptr, b, t0, a, extra, W, W_P2: tl.constexpr):
    """emitted[b] = the a accepted draft tokens, then ``extra``, then -1."""
    i = tl.arange(0, W_P2)
    drafted = tl.load(tokens_ptr + t0 + i, mask=i < a, other=-1)
    vals = tl.where(i < a, drafted, tl.where(i == a, extra, -1))
    tl.store(emitted_ptr + b * W + i, vals.to(tl.int32), mask=i < W)


@triton.jit
def greedy_kernel(part_max_ptr, part_arg_ptr, tokens_ptr, cu_ptr, accepted_ptr, emitted_ptr, V, B, D, W, NSPLIT,
                  NSPLIT_P2: tl.constexpr, W_P2: tl.constexpr):
    """Rule 1 for one session per program, from the pass-1 argmax partials.

    A session whose layout is invalid gets accepted -1 and no emitted token."""
    b = tl.program_id(0).to(tl.int64)
    t0, m, ok = _layout(cu_ptr, b, B, D, W)
    i = tl.arange(0, NSPLIT_P2)
    a = tl.zeros([], dtype=tl.int64)
    alive = ok
    best = tl.full([], -1, tl.int64)
    for pos in range(0, m + 1):
        row = t0 + b + pos
        live = i < tl.where(alive, NSPLIT, 0)  # a block mask from a scalar test (interpreter-safe)
        pm = tl.load(part_max_ptr + row * NSPLIT + i, mask=live, other=NEG_INF)
        pa = tl.load(part_arg_ptr + row * NSPLIT + i, mask=live, other=V)
        top = tl.min(tl.where(pm == tl.max(pm, axis=0), pa, V), axis=0).to(tl.int64)
        best = tl.where(alive, top, best)
        take = alive & (pos < m)
        x = tl.load(tokens_ptr + t0 + pos, mask=take, other=-1)
        take = take & (x == top)
        a += take.to(tl.int64)
        alive = take
    _write_emitted(emitted_ptr, tokens_ptr, b, t0, a, tl.where(ok, best, -1), W, W_P2)
    tl.store(accepted_ptr + b, tl.where(ok, a, -1).to(tl.int32))


@triton.jit
def speculative_kernel(logits_ptr, q_ptr, tokens_ptr, cu_ptr, u_ptr, part_max_ptr, part_sum_ptr, part_arg_ptr,
                       thr_ptr, thr_id_ptr, tm_ptr, tm_stride, tm, tk_ptr, tk_stride, tk, tp_ptr, tp_stride, tp,
                       accepted_ptr, emitted_ptr, bad_ptr, scratch_ptr, V, B, D, W, NSPLIT,
                       BLOCK: tl.constexpr, NBLK_P2: tl.constexpr, NSPLIT_P2: tl.constexpr, W_P2: tl.constexpr,
                       T_ROW: tl.constexpr,
                       K_ROW: tl.constexpr, P_ROW: tl.constexpr, SEARCH: tl.constexpr):
    """Rule 2 for one session per program: the bad check, the acceptance tests, the draw.

    q(x[i]) is read for every position first, so no uniform is read for a bad session (a
    bad layout, profile or token id is bad too). The draw comes from the residual at the
    first rejected position, or from p[M_b+1] when all are accepted.
    """
    b = tl.program_id(0).to(tl.int64)
    t0, m, ok = _layout(cu_ptr, b, B, D, W)
    temp, greedy, k, p, invalid = _row_profile(b, tm_ptr, tm_stride, tm, tk_ptr, tk_stride, tk, tp_ptr, tp_stride,
                                               tp, V, T_ROW, K_ROW, P_ROW)
    searched = (~greedy) & ((k > 0) | (p > 0))
    if not SEARCH:
        searched = searched & False
    nbad = tl.zeros([], dtype=tl.int64)
    for i in range(0, m):
        x = tl.load(tokens_ptr + t0 + i).to(tl.int64)
        x_ok = (x >= 0) & (x < V)
        q = tl.load(q_ptr + (t0 + i) * V + tl.where(x_ok, x, 0))
        nbad += (x_ok & (q > 0.0) & (q < float("inf"))).to(tl.int64) ^ 1
    is_bad = (nbad != 0) | (~ok) | invalid
    alive = ~is_bad
    a = tl.zeros([], dtype=tl.int64)
    for i in range(0, m):
        row = t0 + b + i
        x = tl.load(tokens_ptr + t0 + i, mask=alive, other=0).to(tl.int64)
        q = tl.load(q_ptr + (t0 + i) * V + x, mask=alive, other=1.0).to(tl.float64)
        lmax, norm, thr, thr_id, filtered, _ = _stats(part_max_ptr, part_sum_ptr, part_arg_ptr, thr_ptr, thr_id_ptr,
                                                      row, NSPLIT, temp, greedy, searched & alive, V, NSPLIT_P2)
        lx = tl.load(logits_ptr + row * V + x, mask=alive, other=0.0).to(tl.float32)
        px = _probs(lx, x, lmax, norm, temp, thr, thr_id, filtered, greedy).to(tl.float64)
        r = tl.load(u_ptr + (b * W + i) * 2, mask=alive, other=2.0)
        take = alive & (r < tl.minimum(px / q, 1.0))
        a += take.to(tl.int64)
        alive = take
    row = t0 + b + a
    lmax, norm, thr, thr_id, filtered, _ = _stats(part_max_ptr, part_sum_ptr, part_arg_ptr, thr_ptr, thr_id_ptr, row,
                                                  NSPLIT, temp, greedy, searched & (~is_bad), V, NSPLIT_P2)
    r = tl.load(u_ptr + (b * W + a) * 2 + 1, mask=~is_bad, other=0.0)
    extra = _inverse_cdf(logits_ptr, row, q_ptr, tl.where(a < m, t0 + a, -1), r, ~is_bad, V, lmax, norm, temp, thr,
                         thr_id, filtered, greedy, scratch_ptr + b * 2 * NBLK_P2, BLOCK, NBLK_P2, False)
    _write_emitted(emitted_ptr, tokens_ptr, b, t0, a, extra, W, W_P2)
    tl.store(accepted_ptr + b, a.to(tl.int32))
    tl.store(bad_ptr + b, is_bad)
