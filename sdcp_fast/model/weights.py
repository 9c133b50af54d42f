"""Checkpoint name maps: Hugging Face and GGUF tensor names to ours, and back."""

from __future__ import annotations

import re

import torch

# Ours -> Hugging Face (Llama / Qwen2 / Qwen3 / Mistral / SmolLM2 naming; Gemma and Phi-3 below).
_HF_LAYER = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn.wq.weight": "self_attn.q_proj.weight",
    "attn.wk.weight": "self_attn.k_proj.weight",
    "attn.wv.weight": "self_attn.v_proj.weight",
    "attn.wq.bias": "self_attn.q_proj.bias",
    "attn.wk.bias": "self_attn.k_proj.bias",
    "attn.wv.bias": "self_attn.v_proj.bias",
    "attn.wo.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn.w_gate.weight": "mlp.gate_proj.weight",
    "ffn.w_up.weight": "mlp.up_proj.weight",
    "ffn.w_down.weight": "mlp.down_proj.weight",
    "attn.q_norm.weight": "self_attn.q_norm.weight",
    "attn.k_norm.weight": "self_attn.k_norm.weight",
}
# Gemma 2/3 norm every sublayer's input and output: its "post_attention_layernorm" is the
# norm after attention, not (as in Llama) the one before the MLP.
_HF_GEMMA = {**_HF_LAYER, "ffn_norm.weight": "pre_feedforward_layernorm.weight",
             "post_attn_norm.weight": "post_attention_layernorm.weight",
             "post_ffn_norm.weight": "post_feedforward_layernorm.weight"}
_FUSED = ("attn.wq.", "attn.wk.", "attn.wv.", "ffn.w_gate.", "ffn.w_up.")
_HF_PHI3 = {**{k: v for k, v in _HF_LAYER.items() if not k.startswith(_FUSED)},
            "attn.wqkv.weight": "self_attn.qkv_proj.weight", "ffn.w_gate_up.weight": "mlp.gate_up_proj.weight"}
_HF_FAMILY = {"gemma2": _HF_GEMMA, "gemma3_text": _HF_GEMMA, "phi3": _HF_PHI3}
_HF_TOP = {"embed.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight",
           "lm_head.weight": "lm_head.weight", "head_ids": "sdcp_fast.head_ids"}

_GGUF_LAYER = {
    "attn_norm.weight": "attn_norm.weight",
    "attn.wq.weight": "attn_q.weight",
    "attn.wk.weight": "attn_k.weight",
    "attn.wv.weight": "attn_v.weight",
    "attn.wq.bias": "attn_q.bias",
    "attn.wk.bias": "attn_k.bias",
    "attn.wv.bias": "attn_v.bias",
    "attn.wo.weight": "attn_output.weight",
    "ffn_norm.weight": "ffn_norm.weight",
    "ffn.w_gate.weight": "ffn_gate.weight",
    "ffn.w_up.weight": "ffn_up.weight",
    "ffn.w_down.weight": "ffn_down.weight",
    "attn.q_norm.weight": "attn_q_norm.weight",
    "attn.k_norm.weight": "attn_k_norm.weight",
}
# llama.cpp's Phi-3: one attn_qkv, and ffn_up holds the gate rows, then the up rows.
_GGUF_PHI3 = {**{k: v for k, v in _GGUF_LAYER.items() if not k.startswith(_FUSED)},
              "attn.wqkv.weight": "attn_qkv.weight", "ffn.w_gate_up.weight": "ffn_up.weight"}
_GGUF_GEMMA = {**_GGUF_LAYER, "post_attn_norm.weight": "post_attention_norm.weight",
               "post_ffn_norm.weight": "post_ffw_norm.weight"}
_GGUF_FAMILY = {"phi3": _GGUF_PHI3, "gemma2": _GGUF_GEMMA, "gemma3": _GGUF_GEMMA}
_GGUF_TOP = {"embed.weight": "token_embd.weight", "norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}

_OURS_LAYER = re.compile(r"layers\.(\d+)\.(.+)")


def to_hf_name(name: str, family: str = "llama") -> str:
    m = _OURS_LAYER.fullmatch(name)
    if m:
        return f"model.layers.{m[1]}.{_HF_FAMILY.get(family, _HF_LAYER)[m[2]]}"
    return _HF_TOP[name]


def from_hf_name(name: str, family: str = "llama") -> str | None:
    """Our name for a Hugging Face tensor, or None for tensors we do not use."""
    m = re.fullmatch(r"model\.layers\.(\d+)\.(.+)", name)
    if m:
        inv = {v: k for k, v in _HF_FAMILY.get(family, _HF_LAYER).items()}
        return f"layers.{m[1]}.{inv[m[2]]}" if m[2] in inv else None
    inv = {v: k for k, v in _HF_TOP.items()}
    return inv.get(name)


def from_gguf_name(name: str, arch: str = "llama") -> str | None:
    m = re.fullmatch(r"blk\.(\d+)\.(.+)", name)
    if m:
        inv = {v: k for k, v in _GGUF_FAMILY.get(arch, _GGUF_LAYER).items()}
        return f"layers.{m[1]}.{inv[m[2]]}" if m[2] in inv else None
    inv = {v: k for k, v in _GGUF_TOP.items()}
    return inv.get(name)


def unpermute_rope(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Undo llama.cpp's q/k row permutation (it rotates adjacent pairs, Hugging Face
    rotates the two halves of each head), so GGUF and HF checkpoints share one model."""
    out = w.shape[0]
    rest = w.shape[1:]
    return w.reshape(n_heads, out // n_heads // 2, 2, *rest).transpose(1, 2).reshape(out, *rest)
