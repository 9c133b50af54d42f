"""Bulk generation for making training data: thousands of prompts decoded side by side.

The serving path (``runner.ModelRunner``) keeps a paged cache so that sessions come and go
and are truncated after each verdict. Distillation decodes a fixed set of prompts once,
where left-padded rows in one contiguous cache per layer are simpler and, on a GPU, far
faster (a handful of large kernels per layer and step, no per-session bookkeeping).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from sdcp_fast.kernels import apply_sampling_profile, sample_from_probs

from .llama import Transformer


@dataclass
class Row:
    tokens: list[int]  # the continuation, prompt excluded
    # With ``top_k``: the model's top-k logits before each generated token (its labels for
    # distillation, free since the pass that chose the token computed them).
    top_ids: torch.Tensor | None = None  # [n, k] int32
    top_logits: torch.Tensor | None = None  # [n, k] float16, descending


def generate_rows(model: Transformer, prompts: Sequence[Sequence[int]], max_new: int, *,
                  temperature_milli: int = 0, top_p_milli: int | None = None, stop: Sequence[int] = (),
                  generator: torch.Generator | None = None, top_k: int = 0) -> list[Row]:
    """Each prompt's continuation (up to ``max_new`` tokens, ending at the first ``stop``
    token, which is kept). Temperature 0 is greedy decoding (ties to the smallest id, as
    rule 1); otherwise each token is drawn from the §4.1 profile by inverse CDF with
    uniforms from ``generator``."""
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")
    dev = model.embed.weight.device
    B, P = len(prompts), max(map(len, prompts))
    T = P + max_new
    tokens = torch.zeros((B, T), dtype=torch.int64, device=dev)
    valid = torch.zeros((B, T), dtype=torch.bool, device=dev)  # False on left padding
    for b, p in enumerate(prompts):
        tokens[b, P - len(p):P] = torch.tensor(list(p), dtype=torch.int64)
        valid[b, P - len(p):] = True
    positions = (valid.long().cumsum(1) - 1).clamp_min(0)  # [B, T] each row starts at 0
    cfg = model.cfg
    kv = [(torch.zeros((B, cfg.n_kv_heads, T, cfg.head_dim), dtype=model.embed.weight.dtype, device=dev),
           torch.zeros((B, cfg.n_kv_heads, T, cfg.head_dim), dtype=model.embed.weight.dtype, device=dev))
          for _ in model.layers]
    col = torch.arange(T, device=dev)

    def mask(start: int, n: int) -> torch.Tensor:  # [B, 1, n, start + n]
        q = col[start:start + n, None]
        m = (col[None, :start + n] <= q)[None] & valid[:, None, :start + n]
        return (m | (col[None, :start + n] == q)[None])[:, None]  # padding sees itself: no empty softmax

    stop_ids = torch.tensor(list(stop), dtype=torch.int64, device=dev)
    done = torch.zeros(B, dtype=torch.bool, device=dev)
    lengths = torch.full((B,), max_new, dtype=torch.int64, device=dev)
    tops: list[tuple[torch.Tensor, torch.Tensor]] = []
    with torch.inference_mode():
        h = model.forward_rows(tokens[:, :P], positions[:, :P], kv, 0, mask(0, P))[:, -1]  # [B, dim]
        for t in range(max_new):
            logits = model.logits(h)  # [B, V]
            if top_k:
                top = logits.topk(top_k, dim=-1)  # [B, k]
                tops.append((top.indices.int().cpu(), top.values.half().cpu()))
            if temperature_milli == 0:
                nxt = logits.argmax(-1)  # first maximum: the smallest id
            else:
                probs = apply_sampling_profile(logits, temperature_milli, None, top_p_milli, backend="reference")
                u = torch.rand(B, generator=generator, dtype=torch.float64)
                nxt = sample_from_probs(probs, u.to(dev), backend="reference").long()
            nxt = nxt.masked_fill(done, 0)
            tokens[:, P + t] = nxt
            ended = ~done & torch.isin(nxt, stop_ids)
            lengths = torch.where(ended, t + 1, lengths)
            done |= ended
            if t + 1 == max_new or bool(done.all()):
                break
            h = model.forward_rows(tokens[:, P + t:P + t + 1], positions[:, P + t:P + t + 1], kv, P + t,
                                   mask(P + t, 1))[:, -1]
    out = tokens[:, P:].tolist()
    rows = [Row(row[:n]) for row, n in zip(out, lengths.tolist(), strict=True)]
    if top_k:
        ids, vals = torch.stack([i for i, _ in tops], 1), torch.stack([v for _, v in tops], 1)  # [B, steps, k]
        for b, r in enumerate(rows):
            r.top_ids, r.top_logits = ids[b, : len(r.tokens)].clone(), vals[b, : len(r.tokens)].clone()
    return rows
