"""A GGUF file as our model: its architecture's config (llama.cpp's keys and conventions),
every tensor dequantized to float32 under our names, the tokenizer rebuilt from its metadata.
Architectures, tensors and features the model does not implement are refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer

from . import weights
from .config import ModelConfig, UnsupportedModel

Converted = tuple[ModelConfig, dict[str, torch.Tensor], Tokenizer | None, dict[str, Any]]


def _positive(v: Any) -> float | None:
    return float(v) if v else None


# llama.cpp architectures read (Mistral's GGUFs are "llama"); others are refused.
GGUF_ARCHS = ("llama", "qwen2", "qwen3", "phi3", "gemma2", "gemma3")
# llama.cpp's Gemma: layer il windowed unless il % pattern == pattern - 1; the attention
# scale is 1 / sqrt(head_dim), except for the 27B models (told by their depth): 1 / sqrt(dim / heads).
_GEMMA_PATTERN, _GEMMA_27B_LAYERS = {"gemma2": 2, "gemma3": 6}, {"gemma2": 46, "gemma3": 62}


def convert_gguf(path: Path) -> Converted:
    """Config, float32 state dict (our names), tokenizer and metadata of a GGUF file."""
    import gguf
    import numpy as np

    from .tokenizer import tokenizer_from_gguf

    reader = gguf.GGUFReader(str(path))
    fields = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    arch = fields["general.architecture"]
    if arch not in GGUF_ARCHS:
        raise UnsupportedModel(f"GGUF architecture {arch!r} is not supported ({', '.join(GGUF_ARCHS)})")
    p = f"{arch}."
    names = {t.name for t in reader.tensors}
    unknown = sorted(n for n in names if weights.from_gguf_name(n, arch) is None and n != "rope_freqs.weight")
    if unknown:
        raise UnsupportedModel(f"{path}: tensors a {arch} model does not have: {unknown[:5]}")
    n_heads = int(fields[p + "attention.head_count"])
    n_kv = int(fields.get(p + "attention.head_count_kv", n_heads))
    dim = int(fields[p + "embedding_length"])
    head_dim = int(fields.get(p + "attention.key_length", dim // n_heads))
    if int(fields.get(p + "attention.value_length", head_dim)) != head_dim:
        raise UnsupportedModel(f"{path}: value heads wider or narrower than key heads are not implemented")
    if int(fields.get(p + "rope.dimension_count", head_dim)) != head_dim:
        raise UnsupportedModel(f"{path}: partial rotary embeddings are not implemented")
    scaling: dict[str, Any] | None = None
    kind = fields.get(p + "rope.scaling.type", "none")
    if kind == "linear":
        scaling = {"rope_type": "linear", "factor": float(fields[p + "rope.scaling.factor"])}
    elif kind != "none":
        raise UnsupportedModel(f"{path}: rope scaling {kind!r} is not implemented (none, linear)")
    if "rope_freqs.weight" in names:
        if scaling is not None:
            raise UnsupportedModel(f"{path}: rope frequency factors and rope scaling together are not implemented")
        t = next(t for t in reader.tensors if t.name == "rope_freqs.weight")
        factors = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float64).reshape(-1)
        scaling = {"rope_type": "freq_factors", "factors": factors.tolist()}
    window = fields.get(p + "attention.sliding_window")
    gemma = arch in _GEMMA_PATTERN
    if window and arch != "phi3" and not gemma:  # llama.cpp windows only these, of what we read
        raise UnsupportedModel(f"{path}: a sliding window on a {arch} GGUF is not implemented")
    n_layers = int(fields[p + "block_count"])
    sliding: tuple[int, ...] = tuple(range(n_layers)) if window else ()
    if window and gemma:
        pattern = fields.get(p + "attention.sliding_window_pattern", _GEMMA_PATTERN[arch])
        if isinstance(pattern, list):
            sliding = tuple(i for i, swa in enumerate(pattern) if swa)
        else:
            sliding = tuple(i for i in range(n_layers) if i % int(pattern) < int(pattern) - 1)
    tokens = fields["tokenizer.ggml.tokens"]
    eos = fields.get("tokenizer.ggml.eos_token_id")
    cfg = ModelConfig(
        vocab_size=int(fields.get(p + "vocab_size", len(tokens))),
        dim=dim,
        n_layers=n_layers,
        n_heads=n_heads,
        n_kv_heads=n_kv,
        ffn_dim=int(fields[p + "feed_forward_length"]),
        norm_eps=float(fields.get(p + "attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=float(fields.get(p + "rope.freq_base", 10000.0)),
        rope_scaling=scaling,
        tie_embeddings="output.weight" not in names,
        attention_bias="blk.0.attn_q.bias" in names,
        max_seq_len=int(fields.get(p + "context_length", 8192)),
        bos_token_id=fields.get("tokenizer.ggml.bos_token_id"),
        eos_token_ids=() if eos is None else (int(eos),),
        family="gemma3_text" if arch == "gemma3" else arch,  # the Hugging Face family of its tensors
        explicit_head_dim=None if head_dim == dim // n_heads else head_dim,
        qk_norm=arch in ("qwen3", "gemma3"),
        sliding_window=int(window) if window else None,
        sliding_layers=sliding,
        fused_proj=arch == "phi3",
        rope_local_theta=float(fields.get(p + "rope.freq_base_swa", 10000.0)) if arch == "gemma3" else None,
        norm_unit_offset=gemma,
        post_norms=gemma,
        scale_embeddings=gemma,
        activation="gelu_tanh" if gemma else "silu",
        query_pre_attn_scalar=(None if not gemma else float(dim // n_heads)
                               if n_layers == _GEMMA_27B_LAYERS[arch] else float(head_dim)),
        attn_softcap=_positive(fields.get(p + "attn_logit_softcapping")) if gemma else None,
        logit_softcap=_positive(fields.get(p + "final_logit_softcapping")) if gemma else None,
    )
    state: dict[str, torch.Tensor] = {}
    for t in reader.tensors:
        ours = weights.from_gguf_name(t.name, arch)
        if ours is None:
            continue
        arr = gguf.quants.dequantize(t.data, t.tensor_type)  # [out, in] (GGUF shape reversed)
        w = torch.from_numpy(np.array(arr, dtype=np.float32))  # a writable copy
        # llama.cpp permutes q/k rows for the llama architecture only.
        if arch == "llama" and ours.endswith(("attn.wq.weight", "attn.wq.bias")):
            w = weights.unpermute_rope(w, n_heads)
        elif arch == "llama" and ours.endswith(("attn.wk.weight", "attn.wk.bias")):
            w = weights.unpermute_rope(w, n_kv)
        elif gemma and ours.endswith("norm.weight"):  # llama.cpp stores Gemma's (1 + w): undone
            w = w - 1.0
        state[ours] = w
    meta = {"format": "gguf", "name": fields.get("general.name"), "file_type": fields.get("general.file_type"),
            "quantization": sorted({t.tensor_type.name for t in reader.tensors})}
    return cfg, state, tokenizer_from_gguf(fields), meta
