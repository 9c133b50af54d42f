"""A plain dense forward pass (no cache, full causal mask): the definition the paged
model is tested against."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from sdcp_fast.model.llama import Transformer, apply_rope


def dense_logits(model: Transformer, tokens: list[int], n_layers: int | None = None) -> torch.Tensor:
    """``[T, V]`` logits of every position of one sequence."""
    cfg = model.cfg
    T = len(tokens)
    x = model.embed(torch.tensor(tokens))  # [T, dim]
    freqs = torch.arange(T).float()[:, None] * model.inv_freq[None]  # [T, D/2]
    cos, sin = freqs.cos()[:, None], freqs.sin()[:, None]
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    rep = cfg.n_heads // cfg.n_kv_heads
    for block in model.layers[: n_layers or cfg.n_layers]:
        a = block.attn
        h = block.attn_norm(x)
        q = apply_rope(a.wq(h).view(T, cfg.n_heads, -1), cos, sin).transpose(0, 1)  # [H, T, D]
        k = apply_rope(a.wk(h).view(T, cfg.n_kv_heads, -1), cos, sin).transpose(0, 1)  # [Hkv, T, D]
        v = a.wv(h).view(T, cfg.n_kv_heads, -1).transpose(0, 1)
        k, v = k.repeat_interleave(rep, 0), v.repeat_interleave(rep, 0)  # [H, T, D]
        att = (q @ k.transpose(1, 2)) / cfg.head_dim**0.5  # [H, T, T]
        att = att.masked_fill(~causal, float("-inf")).softmax(-1)
        x = x + a.wo((att @ v).transpose(0, 1).reshape(T, -1))
        f = block.ffn
        h = block.ffn_norm(x)
        x = x + f.w_down(F.silu(f.w_gate(h)) * f.w_up(h))
    return model.logits(model.norm(x))
