"""One decoder for every family we read: RMSNorm, RoPE, grouped-query attention, a gated MLP.

Llama (SmolLM2, Llama 3.x), Qwen2/2.5, Qwen3, Mistral, Gemma 2/3 and Phi-3 are one code path
with the switches of ``config.ModelConfig``: q/k norms, sliding-window layers (in every
attention path, the paged kernel included), (1 + w) norms, norms after attention and MLP,
embedding scaling, attention and logit soft-capping, GeGLU, fused projections. Attention reads and
writes a :class:`~sdcp_fast.model.kv_cache.PagedKVCache`; one forward pass serves a
ragged batch (each sequence brings any number of new tokens after its cached ones). Two
attention paths: ``paged_attention`` reads K and V through the block table (the kernel
library's triton kernel on CUDA; nothing read on the host, so a pass can be a CUDA graph),
or the cache is gathered and handed to SDPA with a padded mask (exact on CPU). On the CPU a
float32 pass without autograd on the gather path runs :mod:`.cpu_pass` instead (row-invariant
native kernels: a position's logits do not depend on the other rows of the pass).
q/k weights use the Hugging Face layout (RoPE rotates the two halves of each head).
``torch.compile`` is left to the caller (see ``runner.ModelRunner(compile=True)``).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from sdcp_fast.kernels import paged_attention, rowwise

from . import cpu_pass
from .batch_layout import BatchLayout
from .config import ROPE_TYPES, ModelConfig
from .kv_cache import PagedKVCache


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, unit_offset: bool = False) -> None:
        super().__init__()
        self.eps = eps
        self.unit_offset = unit_offset
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.unit_offset:  # Gemma scales by (1 + w), in float32 before the cast
            return (xf * (1.0 + self.weight.float())).to(x.dtype)
        return self.weight * xf.to(x.dtype)


def rope_inv_freq(cfg: ModelConfig, local: bool = False) -> torch.Tensor:
    """RoPE frequencies; ``local``: those of the windowed layers (Gemma 3: their own base, unscaled)."""
    d = cfg.head_dim
    theta = cfg.rope_local_theta if local and cfg.rope_local_theta is not None else cfg.rope_theta
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))  # [D/2]
    sc = {} if local else cfg.rope_scaling or {}
    kind = sc.get("rope_type", sc.get("type"))
    if kind not in (*ROPE_TYPES, "freq_factors"):
        raise ValueError(f"rope type {kind!r} is not implemented")
    if kind == "linear":
        inv = inv / sc["factor"]
    if kind == "freq_factors":  # a GGUF's rope_freqs tensor (llama.cpp divides each frequency by it)
        inv = inv / torch.tensor(sc["factors"], dtype=torch.float64)
    if kind == "llama3":
        factor, lo, hi = sc["factor"], sc["low_freq_factor"], sc["high_freq_factor"]
        old = sc["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > old / lo, inv / factor, inv)
        smooth = (old / wavelen - lo) / (hi - lo)
        mid = (wavelen >= old / hi) & (wavelen <= old / lo)
        inv = torch.where(mid, (1 - smooth) * scaled / factor + smooth * scaled, scaled)
    return inv.float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]  # [T, H, D/2] each
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int = 0) -> None:
        super().__init__()
        self.n_heads, self.n_kv, self.hd = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.window = cfg.window(layer)
        self.softcap = cfg.attn_softcap
        self.scale = (cfg.query_pre_attn_scalar or self.hd) ** -0.5
        b = cfg.attention_bias
        self.split = [cfg.n_heads * self.hd, cfg.n_kv_heads * self.hd, cfg.n_kv_heads * self.hd]
        if cfg.fused_proj:
            self.wqkv = nn.Linear(cfg.dim, sum(self.split), bias=b)
        else:
            self.wq = nn.Linear(cfg.dim, cfg.n_heads * self.hd, bias=b)
            self.wk = nn.Linear(cfg.dim, cfg.n_kv_heads * self.hd, bias=b)
            self.wv = nn.Linear(cfg.dim, cfg.n_kv_heads * self.hd, bias=b)
        self.wo = nn.Linear(cfg.n_heads * self.hd, cfg.dim, bias=False)
        self.q_norm = RMSNorm(self.hd, cfg.norm_eps, cfg.norm_unit_offset) if cfg.qk_norm else None
        self.k_norm = RMSNorm(self.hd, cfg.norm_eps, cfg.norm_unit_offset) if cfg.qk_norm else None
        self.fused = cfg.fused_proj

    def _qkv(self, x: torch.Tensor, cos: torch.Tensor,
             sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``x`` ``[..., dim]`` -> q ``[..., H, D]``, k and v ``[..., Hkv, D]``; q/k normed and rotated."""
        if self.fused:
            q, k, v = self.wqkv(x).split(self.split, dim=-1)
        else:
            q, k, v = self.wq(x), self.wk(x), self.wv(x)
        lead = x.shape[:-1]
        q, k, v = q.view(*lead, self.n_heads, self.hd), k.view(*lead, self.n_kv, self.hd), v.view(*lead, self.n_kv, self.hd)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
                causal: bool = False) -> torch.Tensor:
        """q ``[B, H, T, D]``, k and v ``[B, Hkv, L, D]``, ``mask`` ``[B, 1, T, L]`` (True: attend)."""
        if self.softcap is None:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal and mask is None,
                                                  scale=self.scale, enable_gqa=True)
        # Soft-capped scores (Gemma 2): SDPA has no hook between q.k and the softmax.
        rep = self.n_heads // self.n_kv
        k, v = k.repeat_interleave(rep, dim=-3), v.repeat_interleave(rep, dim=-3)
        scores = (q.float() @ k.float().transpose(-1, -2)) * self.scale
        scores = torch.tanh(scores / self.softcap) * self.softcap
        if causal and mask is None:
            mask = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        return (scores.softmax(-1) @ v.float()).to(q.dtype)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: PagedKVCache, layer: int,
                lay: BatchLayout) -> torch.Tensor:
        T = x.shape[0]
        q, k, v = self._qkv(x, cos, sin)  # [T, H, D], [T, Hkv, D] x 2
        cache.write(layer, k.to(cache.dtype), v.to(cache.dtype), lay.slots)
        if lay.attention is not None:  # K and V read in place through the block table
            assert lay.cu_q is not None
            out = paged_attention(q, cache.k[layer], cache.v[layer], lay.table, lay.seq_lens, lay.cu_q,
                                  scale=self.scale, backend=lay.attention, window=self.window,
                                  softcap=self.softcap)  # [T, H, D]
            return self.wo(out.reshape(T, -1))
        keys, vals = cache.gather(layer, lay.table, lay.seq_lens)  # [sum(seq_lens), Hkv, D]
        keys, vals = keys.to(q.dtype), vals.to(q.dtype)
        mask = lay.mask_for(self.window)
        if lay.q_index is None or lay.k_index is None:  # one sequence, no padding
            qp, kp, vp = q[None].transpose(1, 2), keys[None].transpose(1, 2), vals[None].transpose(1, 2)
        else:
            qp = q[lay.q_index].transpose(1, 2)  # [B, H, Tmax, D]
            kp = keys[lay.k_index].transpose(1, 2)  # [B, Hkv, Lmax, D]
            vp = vals[lay.k_index].transpose(1, 2)
        out = self._attend(qp, kp, vp, mask).transpose(1, 2)  # [B, Tmax, H, D]
        flat = torch.cat([out[b, :n] for b, n in enumerate(lay.q_lens)]) if lay.q_index is not None else out[0]
        return self.wo(flat.reshape(T, -1))

    def forward_dense(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Training path: full causal attention over ``x`` ``[B, T, dim]``, no cache."""
        B, T, _ = x.shape
        q, k, v = (t.transpose(1, 2) for t in self._qkv(x, cos, sin))  # [B, H or Hkv, T, D]
        mask = None
        if self.window is not None:
            i = torch.arange(T, device=x.device)
            mask = ((i[None, :] <= i[:, None]) & (i[None, :] > i[:, None] - self.window))[None, None]
        out = self._attend(q, k, v, mask, causal=True)  # [B, H, T, D]
        return self.wo(out.transpose(1, 2).reshape(B, T, -1))

    def forward_rows(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv: tuple[torch.Tensor, torch.Tensor],
                     start: int, mask: torch.Tensor) -> torch.Tensor:
        """Bulk generation: ``x`` ``[B, T, dim]`` are columns ``start..start+T`` of every row,
        written into the contiguous cache ``kv`` (``[B, Hkv, Tmax, D]`` each); ``mask``
        ``[B, 1, T, start+T]`` says which columns each query sees."""
        if self.window is not None:
            raise NotImplementedError("bulk generation does not implement sliding-window layers")
        B, T, _ = x.shape
        q, k, v = (t.transpose(1, 2) for t in self._qkv(x, cos, sin))
        kc, vc = kv
        kc[:, :, start:start + T] = k.to(kc.dtype)
        vc[:, :, start:start + T] = v.to(vc.dtype)
        out = self._attend(q, kc[:, :, :start + T].to(q.dtype), vc[:, :, :start + T].to(q.dtype), mask)  # [B, H, T, D]
        return self.wo(out.transpose(1, 2).reshape(B, T, -1))


class FeedForward(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.fused = cfg.fused_proj
        if self.fused:
            self.w_gate_up = nn.Linear(cfg.dim, 2 * cfg.ffn_dim, bias=False)  # gate rows, then up rows
        else:
            self.w_gate = nn.Linear(cfg.dim, cfg.ffn_dim, bias=False)
            self.w_up = nn.Linear(cfg.dim, cfg.ffn_dim, bias=False)
        self.w_down = nn.Linear(cfg.ffn_dim, cfg.dim, bias=False)
        if cfg.activation not in ("silu", "gelu_tanh"):
            raise ValueError(f"activation {cfg.activation!r} is not implemented")
        self.gelu = cfg.activation == "gelu_tanh"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused:
            gate, up = self.w_gate_up(x).chunk(2, dim=-1)
        else:
            gate, up = self.w_gate(x), self.w_up(x)
        act = F.gelu(gate, approximate="tanh") if self.gelu else F.silu(gate)  # GeGLU or SwiGLU
        return self.w_down(act * up)  # [T, dim]


Rope = list[tuple[torch.Tensor, torch.Tensor]]  # cos and sin: global layers', then windowed layers'


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int = 0) -> None:
        super().__init__()
        unit = cfg.norm_unit_offset
        self.attn_norm = RMSNorm(cfg.dim, cfg.norm_eps, unit)
        self.attn = Attention(cfg, layer)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps, unit)
        self.ffn = FeedForward(cfg)
        # Gemma 2/3 normalise each sublayer's output too, before the residual add.
        self.post_attn_norm = RMSNorm(cfg.dim, cfg.norm_eps, unit) if cfg.post_norms else None
        self.post_ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps, unit) if cfg.post_norms else None
        self.rope_index = int(cfg.rope_local_theta is not None and cfg.window(layer) is not None)

    @staticmethod
    def _add(x: torch.Tensor, out: torch.Tensor, norm: RMSNorm | None) -> torch.Tensor:
        return x + (out if norm is None else norm(out))

    def _mlp(self, x: torch.Tensor) -> torch.Tensor:
        return self._add(x, self.ffn(self.ffn_norm(x)), self.post_ffn_norm)

    def forward(self, x: torch.Tensor, rope: Rope, cache: PagedKVCache, layer: int,
                lay: BatchLayout) -> torch.Tensor:
        cos, sin = rope[self.rope_index]
        return self._mlp(self._add(x, self.attn(self.attn_norm(x), cos, sin, cache, layer, lay), self.post_attn_norm))

    def forward_dense(self, x: torch.Tensor, rope: Rope) -> torch.Tensor:
        cos, sin = rope[self.rope_index]
        return self._mlp(self._add(x, self.attn.forward_dense(self.attn_norm(x), cos, sin), self.post_attn_norm))

    def forward_rows(self, x: torch.Tensor, rope: Rope, kv: tuple[torch.Tensor, torch.Tensor],
                     start: int, mask: torch.Tensor) -> torch.Tensor:
        cos, sin = rope[self.rope_index]
        out = self.attn.forward_rows(self.attn_norm(x), cos, sin, kv, start, mask)
        return self._mlp(self._add(x, out, self.post_attn_norm))


def _on_meta() -> bool:
    """Inside ``with torch.device("meta")``: a loader's skeleton, every tensor assigned after.
    Init is skipped there because torch runs ``normal_`` and ``arange`` on meta through Python
    references whose first use imports ``torch._dynamo`` (seconds on a loaded machine)."""
    return torch.empty(0).device.type == "meta"


def _embedding(vocab: int, dim: int) -> nn.Embedding:
    """``nn.Embedding(vocab, dim)`` (the same init, the same draws), none on the meta device."""
    w = torch.empty(vocab, dim)
    if w.device.type != "meta":
        nn.init.normal_(w)
    return nn.Embedding(vocab, dim, _weight=w)


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = _embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps, cfg.norm_unit_offset)
        self.lm_head = None if cfg.tie_embeddings else nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        inv_freq = torch.empty((cfg.head_dim + 1) // 2, dtype=torch.float32) if _on_meta() else rope_inv_freq(cfg)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        local = None
        if cfg.rope_local_theta is not None:
            local = torch.empty_like(inv_freq) if _on_meta() else rope_inv_freq(cfg, local=True)
        self.register_buffer("inv_freq_local", local, persistent=False)
        # A draft's reduced output layer: logits for these token ids only, -inf elsewhere.
        self.register_buffer("head_ids", torch.zeros(cfg.head_vocab, dtype=torch.int64) if cfg.head_vocab else None)
        self._head_rows: tuple[tuple[int, ...], torch.Tensor] | None = None
        # A quantized output layer (model/quant_weights.py: --weights q8_0|q4) used by logits().
        self.quant_head: nn.Module | None = None

    def rope(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin ``[..., 1, D/2]`` for ``positions`` ``[...]`` (the 1 broadcasts over heads)."""
        freqs = positions.float()[..., None] * self.inv_freq  # [..., D/2]
        return freqs.cos().unsqueeze(-2).to(dtype), freqs.sin().unsqueeze(-2).to(dtype)

    def ropes(self, positions: torch.Tensor, dtype: torch.dtype) -> Rope:
        """:meth:`rope` for the global layers and (Gemma 3) with the windowed layers' frequencies."""
        glob = self.rope(positions, dtype)
        if self.inv_freq_local is None:
            return [glob]
        freqs = positions.float()[..., None] * self.inv_freq_local
        return [glob, (freqs.cos().unsqueeze(-2).to(dtype), freqs.sin().unsqueeze(-2).to(dtype))]

    def embed_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        if self.cfg.scale_embeddings:  # Gemma: sqrt(dim), rounded to the activations' dtype first
            x = x * torch.tensor(self.cfg.dim**0.5, dtype=x.dtype)
        return x

    def head_weight(self) -> torch.Tensor:
        return self.embed.weight if self.lm_head is None else self.lm_head.weight  # [V, dim]

    def forward(self, tokens: torch.Tensor, cache: PagedKVCache, lay: BatchLayout,
                n_layers: int | None = None) -> torch.Tensor:
        """Hidden states after the final norm, ``[T, dim]``, for the new ``tokens`` ``[T]``.
        ``n_layers`` runs only the first layers (self-speculative layer skipping)."""
        x = self.embed_tokens(tokens)  # [T, dim]
        if cpu_pass.usable(x, cache, lay):  # row-invariant native kernels (model/cpu_pass.py)
            return cpu_pass.forward(self, x, cache, lay, n_layers)
        rope = self.ropes(lay.positions, x.dtype)  # [T, 1, D/2] each
        for i, block in enumerate(self.layers[: n_layers or len(self.layers)]):
            x = block(x, rope, cache, i, lay)
        return self.norm(x)

    def forward_dense(self, tokens: torch.Tensor) -> torch.Tensor:
        """Training path (differentiable, no cache): hidden states after the final norm,
        ``[B, T, dim]``, for whole sequences ``tokens`` ``[B, T]`` starting at position 0."""
        x = self.embed_tokens(tokens)  # [B, T, dim]
        pos = torch.arange(tokens.shape[1], device=tokens.device)
        rope = self.ropes(pos, x.dtype)  # [T, 1, D/2] each, the same for every row
        for block in self.layers:
            x = block.forward_dense(x, rope)
        return self.norm(x)

    def forward_rows(self, tokens: torch.Tensor, positions: torch.Tensor, kv: list[tuple[torch.Tensor, torch.Tensor]],
                     start: int, mask: torch.Tensor) -> torch.Tensor:
        """Bulk generation over a contiguous cache (see ``sdcp_fast.model.bulk``): hidden
        states after the final norm, ``[B, T, dim]``, for columns ``start..start+T`` of
        ``tokens`` ``[B, T]`` at ``positions`` ``[B, T]``."""
        x = self.embed_tokens(tokens)  # [B, T, dim]
        rope = self.ropes(positions, x.dtype)  # [B, T, 1, D/2] each
        for block, layer_kv in zip(self.layers, kv, strict=True):
            x = block.forward_rows(x, rope, layer_kv, start, mask)
        return self.norm(x)

    def head_rows(self) -> torch.Tensor:
        """The output layer's rows of ``head_ids`` ``[S, dim]``, gathered again only when the
        weight or the ids move or change (storage and in-place version)."""
        assert self.head_ids is not None
        w = self.head_weight()
        key = (w.data_ptr(), w._version, self.head_ids.data_ptr(), self.head_ids._version)
        if self._head_rows is None or self._head_rows[0] != key or w.requires_grad:
            self._head_rows = (key, w[self.head_ids])
        return self._head_rows[1]

    def _cap(self, logits: torch.Tensor) -> torch.Tensor:
        cap = self.cfg.logit_softcap
        return logits if cap is None else torch.tanh(logits / cap) * cap  # Gemma 2

    @staticmethod
    def _head(hidden: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """``hidden @ w.T``: on the CPU without autograd, the row-invariant product, so a row's
        logits do not depend on how many rows the pass asks for (model/cpu_pass.py)."""
        if (hidden.device.type == "cpu" and hidden.dtype == torch.float32 == w.dtype and not torch.is_grad_enabled()
                and rowwise.available()):
            return rowwise.linear(hidden.reshape(-1, hidden.shape[-1]), w).view(*hidden.shape[:-1], w.shape[0])
        return F.linear(hidden, w)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.head_ids is None:
            if self.quant_head is not None:
                return self._cap(self.quant_head(hidden).float())
            return self._cap(self._head(hidden, self.head_weight()).float())  # [N, V]
        sub = self._cap(self._head(hidden, self.head_rows()).float())  # [N, S]
        out = sub.new_full((*sub.shape[:-1], self.cfg.vocab_size), float("-inf"))  # [N, V]
        return out.index_copy_(-1, self.head_ids, sub)
