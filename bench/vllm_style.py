"""A peer for bench/verify_kernels.py: rule-2 verification the way vLLM V1's rejection sampler does it,
written here from its published algorithm (not copied):

1. probabilities by a softmax over the drafted rows only (M rows per session: the bonus row
   is sampled elsewhere, so its token arrives as an input here);
2. a recovered-token kernel: for every drafted row, the token of max(0, p - q) drawn by an
   exponential race, argmax_j max(0, p_j - q_j) / e_j with e ~ Exp(1) drawn once per session;
3. an accept kernel, one program per session: accept x_i while q(x_i) > 0 and
   p(x_i) / q(x_i) >= u_i; the first rejected position emits its recovered token; if all
   are accepted, the bonus token follows.

Outputs ``[B, M + 1]`` int32 padded with -1, as ours. Triton on CUDA; plain torch elsewhere.
"""

from __future__ import annotations

from typing import Any

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # the torch path still runs
    triton = None


if triton is not None:

    @triton.jit
    def _recovered_kernel(p_ptr, q_ptr, e_ptr, out_ptr, M, V, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        session = row // M
        best = tl.full([], -1.0, tl.float32)
        best_id = tl.zeros([], dtype=tl.int64)
        for start in range(0, V, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            mask = offs < V
            p = tl.load(p_ptr + row * V + offs, mask=mask, other=0.0)
            q = tl.load(q_ptr + row * V + offs, mask=mask, other=0.0)
            e = tl.load(e_ptr + session * V + offs, mask=mask, other=1.0)
            score = tl.where(mask, tl.maximum(p - q, 0.0) / e, -1.0)
            m = tl.max(score, axis=0)
            at = tl.min(tl.where(score == m, offs, V), axis=0).to(tl.int64)
            best_id = tl.where(m > best, at, best_id)
            best = tl.maximum(best, m)
        tl.store(out_ptr + row, best_id.to(tl.int32))

    @triton.jit
    def _accept_kernel(p_ptr, q_ptr, ids_ptr, u_ptr, recovered_ptr, bonus_ptr, out_ptr, M, V):
        b = tl.program_id(0).to(tl.int64)
        alive = tl.full([], 1, tl.int32)
        for i in range(0, M):
            row = b * M + i
            x = tl.load(ids_ptr + row).to(tl.int64)
            q = tl.load(q_ptr + row * V + x)
            p = tl.load(p_ptr + row * V + x)
            ok = (q > 0.0) & (p / q >= tl.load(u_ptr + row))
            token = tl.where(ok, x, tl.load(recovered_ptr + row).to(tl.int64))
            tl.store(out_ptr + b * (M + 1) + i, tl.where(alive != 0, token, -1).to(tl.int32))
            alive = alive * ok.to(tl.int32)
        tl.store(out_ptr + b * (M + 1) + M, tl.where(alive != 0, tl.load(bonus_ptr + b), -1).to(tl.int32))


def _torch(p: torch.Tensor, q: torch.Tensor, ids: torch.Tensor, u: torch.Tensor, e: torch.Tensor,
           bonus: torch.Tensor, b: int, m: int) -> torch.Tensor:
    recovered = (torch.clamp(p - q, min=0.0).view(b, m, -1) / e.unsqueeze(1)).argmax(2)
    px, qx = p.gather(1, ids.unsqueeze(1)).view(b, m), q.gather(1, ids.unsqueeze(1)).view(b, m)
    ok = (qx > 0) & (px / qx >= u.view(b, m))
    alive = torch.cumprod(ok.int(), 1)
    before = torch.cat([torch.ones(b, 1, dtype=torch.int32, device=p.device), alive[:, :-1]], 1)
    tokens = torch.where(ok, ids.view(b, m), recovered)
    out = torch.where(before.bool(), tokens, -1)
    last = torch.where(alive[:, -1].bool(), bonus, -1)
    return torch.cat([out, last.unsqueeze(1)], 1).to(torch.int32)


def verify(drafted_logits: torch.Tensor, q_probs: torch.Tensor, draft_ids: torch.Tensor, bonus: torch.Tensor,
           u: torch.Tensor, m: int, e: torch.Tensor | None = None, use_triton: bool | None = None) -> torch.Tensor:
    """drafted_logits, q_probs ``[B*M, V]`` float32; draft_ids ``[B*M]``; bonus ``[B]``; u ``[B*M]`` float32;
    e ``[B, V]`` the exponential race's noise (drawn here when absent, as vLLM does per call)."""
    rows, vocab = drafted_logits.shape
    b = rows // m
    p = torch.softmax(drafted_logits, dim=-1)
    if e is None:
        e = torch.empty(b, vocab, device=p.device).exponential_()
    if use_triton is None:
        use_triton = triton is not None and p.device.type == "cuda"
    if not use_triton:
        return _torch(p, q_probs, draft_ids, u, e, bonus, b, m)
    recovered = torch.empty(rows, dtype=torch.int32, device=p.device)
    _recovered_kernel[(rows,)](p, q_probs, e, recovered, m, vocab, BLOCK=1024)
    out = torch.empty(b, m + 1, dtype=torch.int32, device=p.device)
    _accept_kernel[(b,)](p, q_probs, draft_ids, u, recovered, bonus, out, m, vocab)
    return out


def inputs(args: dict[str, Any], b: int, m: int) -> dict[str, Any]:
    """This peer's inputs from bench/verify_kernels.py's batch: the drafted rows only, float32 uniforms."""
    logits = args["target_logits"]
    vocab = logits.shape[1]
    drafted = logits.view(b, m + 1, vocab)[:, :m].reshape(b * m, vocab).contiguous()
    bonus = logits.view(b, m + 1, vocab)[:, m].argmax(1).to(torch.int32)
    return dict(drafted_logits=drafted, q_probs=args["q_probs"], draft_ids=args["draft_tokens"], bonus=bonus,
                u=args["uniforms"][:, :m, 0].reshape(-1).to(torch.float32).contiguous(), m=m)
