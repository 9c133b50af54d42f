"""The reference backend: plain torch, float64 wherever a value decides an outcome.

This module is the definition the ``cpu`` and ``triton`` backends are tested against;
it favours readability over speed. Inputs arrive validated by :mod:`.params`.
"""

from __future__ import annotations

import torch

from .params import Profile, Ragged


def profile_probs(logits: torch.Tensor, prof: Profile) -> torch.Tensor:
    """§4.1 target distribution of each row, float64 ``[N, V]``.

    Order of tokens for top-k and top-p: logit descending, then token id ascending (the
    same order as probability descending, but exact in every precision). Top-k keeps the
    first k tokens of that order. Top-p then keeps token j iff the mass of the kept tokens
    that precede j is < top_p * (mass kept by top-k). Temperature 0 is the one-hot argmax.
    """
    x = logits.to(torch.float64)
    n, vocab = x.shape
    temp = prof.temperature_milli.to(x.device, torch.float64).unsqueeze(1) / 1000.0
    greedy = temp == 0
    z = x / torch.where(greedy, 1.0, temp)
    w = torch.exp(z - z.max(dim=1, keepdim=True).values)
    if not bool(greedy.any() | (prof.top_k > 0).any() | (prof.top_p_milli > 0).any()):
        return w / w.sum(dim=1, keepdim=True)  # plain softmax: no ranking needed
    order = torch.sort(x, dim=1, descending=True, stable=True).indices  # stable: ties by id asc
    ws = w.gather(1, order)
    rank = torch.arange(vocab, device=x.device).expand(n, vocab)
    k = prof.top_k.to(x.device).unsqueeze(1)
    keep = (k == 0) | (rank < k)
    keep &= ~greedy | (rank == 0)
    ws = torch.where(keep, ws, 0.0)
    top_p = prof.top_p_milli.to(x.device, torch.float64).unsqueeze(1) / 1000.0
    before = torch.cat([torch.zeros_like(ws[:, :1]), torch.cumsum(ws, dim=1)[:, :-1]], dim=1)
    keep &= (top_p == 0) | (before < top_p * ws.sum(dim=1, keepdim=True))
    ws = torch.where(keep, ws, 0.0)
    probs = torch.zeros_like(ws).scatter_(1, order, ws)
    return probs / probs.sum(dim=1, keepdim=True)


def apply_sampling_profile(logits: torch.Tensor, prof: Profile) -> torch.Tensor:
    """The rows' probabilities as float32; one under float32's smallest normal number is 0.

    Such a probability (below ~1.2e-38, e.g. a token 0.09 logits behind at temperature
    0.001) has no agreed value among the backends: their exps run in float32, where it falls
    in the subnormal range (the C++ polynomial returns 0 there, a GPU's exp flushes it), so
    every backend returns it as 0.
    """
    p = profile_probs(logits, prof).to(torch.float32)
    return torch.where(p < torch.finfo(torch.float32).tiny, 0.0, p)


def inverse_cdf(weights: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """Smallest token id j whose cumulative weight (ascending ids) exceeds r * total, per row.

    weights: ``[N, V]`` non-negative (need not sum to 1), summed in float64.
    r: ``[N]`` in [0, 1). If rounding leaves no such j, the largest id with positive
    weight; -1 for a row whose total weight is not positive.
    """
    w = weights.to(torch.float64)
    c = torch.cumsum(w, dim=1)
    total = c[:, -1:]
    j = torch.searchsorted(c, r.to(torch.float64).unsqueeze(1) * total, right=True).squeeze(1)
    ids = torch.arange(w.shape[1], device=w.device)
    last_positive = torch.where(w > 0, ids, -1).max(dim=1).values
    j = torch.where(j >= w.shape[1], last_positive, j)
    return torch.where(total.squeeze(1) > 0, j, -1)


def sample_from_probs(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    return inverse_cdf(probs, u).to(torch.int32)


def verify_greedy(target_logits: torch.Tensor, draft_tokens: torch.Tensor,
                  lay: Ragged) -> tuple[torch.Tensor, torch.Tensor]:
    batch, dev = lay.batch, target_logits.device
    accepted = torch.zeros(batch, dtype=torch.int32, device=dev)
    emitted = torch.full((batch, lay.m_max + 1), -1, dtype=torch.int32, device=dev)
    # argmax returns the first maximum, i.e. ties go to the smallest token id.
    best = target_logits.argmax(dim=1).cpu()
    tokens = draft_tokens.cpu()
    for b in range(batch):
        start, end = int(lay.cu_draft[b]), int(lay.cu_draft[b + 1])
        row = start + b
        a = 0
        while a < end - start and int(tokens[start + a]) == int(best[row + a]):
            a += 1
        accepted[b] = a
        emitted[b, : a + 1] = best[row : row + a + 1].to(torch.int32)
    return accepted, emitted


def verify_speculative(target_logits: torch.Tensor, prof: Profile, q_probs: torch.Tensor,
                       draft_tokens: torch.Tensor, lay: Ragged,
                       u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rule 2 of §6.4, one session and one position at a time (the definition).

    Reads target rows 1..a+1 (their normalizer), q(x[i]) for every position (the bad
    check), the q row at the first rejection, and nothing after it.
    """
    batch, dev = lay.batch, target_logits.device
    accepted = torch.zeros(batch, dtype=torch.int32, device=dev)
    emitted = torch.full((batch, lay.m_max + 1), -1, dtype=torch.int32, device=dev)
    bad = torch.zeros(batch, dtype=torch.bool, device=dev)
    tokens = draft_tokens.cpu().tolist()
    for b in range(batch):
        start, end = int(lay.cu_draft[b]), int(lay.cu_draft[b + 1])
        xs = tokens[start:end]
        q_at_x = q_probs[torch.arange(start, end, device=dev), torch.tensor(xs, device=dev, dtype=torch.long)]
        if not bool(((q_at_x > 0) & torch.isfinite(q_at_x)).all()):  # NaN and inf are unusable too
            bad[b] = True
            continue
        row_prof = Profile(prof.temperature_milli[b : b + 1], prof.top_k[b : b + 1],
                           prof.top_p_milli[b : b + 1])
        out: list[int] = []
        for i, x in enumerate(xs):
            p = profile_probs(target_logits[start + b + i : start + b + i + 1], row_prof)[0]
            r = float(u[b, i, 0])
            if r < min(1.0, float(p[x]) / float(q_at_x[i])):
                out.append(x)
                continue
            residual = torch.clamp(p - q_probs[start + i].to(torch.float64), min=0.0)
            if not float(residual.sum()) > 0:  # p == q up to rounding: the residual is p itself
                residual = p
            out.append(int(inverse_cdf(residual.unsqueeze(0), u[b, i, 1].reshape(1))[0]))
            break
        else:
            m = len(xs)
            p = profile_probs(target_logits[end + b : end + b + 1], row_prof)
            out.append(int(inverse_cdf(p, u[b, m, 1].reshape(1))[0]))
        accepted[b] = len(out) - 1
        emitted[b, : len(out)] = torch.tensor(out, dtype=torch.int32)
    return accepted, emitted, bad


def write_paged_kv(cache: torch.Tensor, values: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    flat = cache.view(-1, *cache.shape[2:])
    keep = slot_mapping >= 0
    flat[slot_mapping[keep]] = values[keep]


def gather_slots(block_table: torch.Tensor, seq_lens: torch.Tensor, block_size: int) -> torch.Tensor:
    """Cache slot of every position, sessions concatenated in batch order, int64 ``[sum(seq_lens)]``."""
    lens = seq_lens.to(torch.int64)
    session = torch.repeat_interleave(torch.arange(lens.numel(), device=lens.device), lens)
    starts = torch.cumsum(lens, 0) - lens
    pos = torch.arange(session.numel(), device=lens.device) - starts[session]
    blocks = block_table.to(torch.int64)[session, pos // block_size]
    return blocks * block_size + pos % block_size


def gather_paged_kv(cache: torch.Tensor, block_table: torch.Tensor, seq_lens: torch.Tensor) -> torch.Tensor:
    flat = cache.view(-1, *cache.shape[2:])
    return flat[gather_slots(block_table, seq_lens, cache.shape[1])]


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
                    seq_lens: torch.Tensor, cu_q: torch.Tensor, scale: float, window: int | None = None,
                    softcap: float | None = None) -> torch.Tensor:
    """Causal attention of each session's query rows over its cached keys, in float32 (the definition).

    Query row i of session b (rows cu_q[b]..cu_q[b+1]) sits at position
    ``seq_lens[b] - q_len_b + i`` and attends to positions 0..that position (with a
    ``window``: only those > position - window). Query head h reads KV head ``h // (H / H_kv)``.
    Scores are ``q.k * scale``, then ``softcap * tanh(score / softcap)`` where ``softcap`` is set.
    """
    out = torch.empty_like(q)
    heads, kv_heads = q.shape[1], k_cache.shape[2]
    flat_k = k_cache.view(-1, *k_cache.shape[2:])
    flat_v = v_cache.view(-1, *v_cache.shape[2:])
    for b in range(block_table.shape[0]):
        q0, q1, n = int(cu_q[b]), int(cu_q[b + 1]), int(seq_lens[b])
        if q1 == q0:
            continue
        slots = gather_slots(block_table[b : b + 1], seq_lens[b : b + 1], k_cache.shape[1])
        k = flat_k[slots].float().repeat_interleave(heads // kv_heads, dim=1)  # [n, H, D]
        v = flat_v[slots].float().repeat_interleave(heads // kv_heads, dim=1)
        rows = q[q0:q1].float()  # [t, H, D]
        scores = torch.einsum("thd,nhd->htn", rows, k) * scale
        if softcap is not None:
            scores = torch.tanh(scores / softcap) * softcap
        pos = n - (q1 - q0) + torch.arange(q1 - q0, device=q.device)
        keys = torch.arange(n, device=q.device)[None, :]
        visible = keys <= pos[:, None]  # [t, n]
        if window is not None:
            visible &= keys > pos[:, None] - window
        p = torch.softmax(scores.masked_fill(~visible[None], float("-inf")), dim=2)
        out[q0:q1] = torch.einsum("htn,nhd->thd", p, v).to(q.dtype)
    return out
