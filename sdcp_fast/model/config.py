"""Model shapes: one dataclass for every decoder family we read (Llama, Qwen2, Qwen3,
Mistral, Gemma 2, Gemma 3, Phi-3), with the per-family switches ``llama.Transformer``
honours. :meth:`ModelConfig.from_hf` refuses what the model does not implement (an unknown
``model_type``, rope type, activation or attention kind) instead of serving another function."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    ffn_dim: int
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    # Llama 3.x stretches long wavelengths; None means plain RoPE.
    rope_scaling: dict[str, Any] | None = None
    tie_embeddings: bool = True
    attention_bias: bool = False  # Qwen2.5 has q/k/v biases
    max_seq_len: int = 8192
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = field(default_factory=tuple)
    # A draft whose output layer covers only this many token ids (``Transformer.head_ids``):
    # the vocabulary-wide head would otherwise cost more than its layers.
    head_vocab: int | None = None
    # Per-family switches (defaults: Llama). The family names the checkpoint's tensor names.
    family: str = "llama"
    explicit_head_dim: int | None = None  # Qwen3, Gemma, Mistral Nemo: not dim / n_heads
    qk_norm: bool = False  # Qwen3, Gemma 3: RMSNorm over each head of q and k, before RoPE
    sliding_window: int | None = None  # a windowed layer's query sees its last `sliding_window` keys
    sliding_layers: tuple[int, ...] = ()  # the windowed layers
    rope_local_theta: float | None = None  # Gemma 3: windowed layers' RoPE base (no scaling)
    norm_unit_offset: bool = False  # Gemma: RMSNorm scales by (1 + w)
    post_norms: bool = False  # Gemma 2/3: norms after attention and after the MLP as well
    scale_embeddings: bool = False  # Gemma: embeddings times sqrt(dim)
    activation: str = "silu"  # gated MLP activation: "silu" (SwiGLU) or "gelu_tanh" (GeGLU)
    query_pre_attn_scalar: float | None = None  # Gemma: attention scale is this ** -0.5
    attn_softcap: float | None = None  # Gemma 2: scores -> cap * tanh(scores / cap)
    logit_softcap: float | None = None  # Gemma 2: logits -> cap * tanh(logits / cap)
    fused_proj: bool = False  # Phi-3: one qkv projection and one gate_up projection

    @property
    def head_dim(self) -> int:
        return self.explicit_head_dim or self.dim // self.n_heads

    def window(self, layer: int) -> int | None:
        """The sliding window of ``layer``, None where it sees every earlier position."""
        return self.sliding_window if layer in self.sliding_layers else None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["eos_token_ids"] = list(self.eos_token_ids)
        d["sliding_layers"] = list(self.sliding_layers)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelConfig:
        d = dict(d)
        d["eos_token_ids"] = tuple(d.get("eos_token_ids") or ())
        d["sliding_layers"] = tuple(d.get("sliding_layers") or ())
        return cls(**d)

    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> ModelConfig:
        """From a Hugging Face ``config.json``; :class:`UnsupportedModel` for a family or
        feature the model does not implement."""
        return _from_hf(hf)

    def with_layers(self, n_layers: int, head_vocab: int | None = None) -> ModelConfig:
        return replace(self, n_layers=n_layers, head_vocab=head_vocab)


# Named shapes, for building models from scratch (tests, distillation) and for reading.
CONFIGS: dict[str, ModelConfig] = {
    "smollm2-135m": ModelConfig(vocab_size=49152, dim=576, n_layers=30, n_heads=9, n_kv_heads=3,
                                ffn_dim=1536, norm_eps=1e-5, rope_theta=100000.0, bos_token_id=1,
                                eos_token_ids=(2,)),
    "llama-3.2-1b": ModelConfig(vocab_size=128256, dim=2048, n_layers=16, n_heads=32, n_kv_heads=8,
                                ffn_dim=8192, rope_theta=500000.0,
                                rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                              "high_freq_factor": 4.0,
                                              "original_max_position_embeddings": 8192},
                                max_seq_len=131072, bos_token_id=128000, eos_token_ids=(128001, 128009)),
    "qwen2.5-0.5b": ModelConfig(vocab_size=151936, dim=896, n_layers=24, n_heads=14, n_kv_heads=2,
                                ffn_dim=4864, norm_eps=1e-6, rope_theta=1000000.0, attention_bias=True,
                                max_seq_len=32768, eos_token_ids=(151645, 151643)),
    # The small pair trained here from scratch for fast tests (see docs/models.md).
    "tiny-target": ModelConfig(vocab_size=4096, dim=256, n_layers=4, n_heads=4, n_kv_heads=2, ffn_dim=768,
                               max_seq_len=2048),
    "tiny-draft": ModelConfig(vocab_size=4096, dim=128, n_layers=1, n_heads=2, n_kv_heads=1, ffn_dim=384,
                              max_seq_len=2048),
}


class UnsupportedModel(ValueError):
    """A checkpoint whose architecture or feature ``llama.Transformer`` does not implement."""


# model_type -> the family's defaults where a config.json leaves a key out.
_FAMILIES: dict[str, dict[str, Any]] = {
    "llama": {"act": "silu"},
    "qwen2": {"act": "silu"},
    "qwen3": {"act": "silu"},
    "mistral": {"act": "silu"},
    "phi3": {"act": "silu"},
    "gemma2": {"act": "gelu_pytorch_tanh", "tie": True, "pattern": 2},
    "gemma3_text": {"act": "gelu_pytorch_tanh", "tie": True, "pattern": 6},
}
_ACTIVATIONS = {"silu": "silu", "gelu_pytorch_tanh": "gelu_tanh"}
ROPE_TYPES = (None, "default", "llama3", "linear")


def _rope(params: dict[str, Any] | None, where: str) -> tuple[float, dict[str, Any] | None]:
    """(theta, scaling or None) of one set of rope parameters; refuses what rope_inv_freq lacks."""
    params = dict(params or {})
    kind = params.get("rope_type", params.get("type"))
    if kind not in ROPE_TYPES:
        raise UnsupportedModel(f"{where}: rope type {kind!r} is not implemented ({', '.join(map(str, ROPE_TYPES[1:]))})")
    if float(params.get("partial_rotary_factor", 1.0)) != 1.0:
        raise UnsupportedModel(f"{where}: partial rotary embeddings are not implemented")
    theta = float(params.pop("rope_theta", 10000.0))
    params.pop("partial_rotary_factor", None)
    return theta, (params if kind in ("llama3", "linear") else None)


def _from_hf(hf: dict[str, Any]) -> ModelConfig:
    family = hf.get("model_type")
    if family not in _FAMILIES:
        hint = " (the multimodal Gemma 3 wrapper; its text model, gemma3_text, is)" if family == "gemma3" else ""
        raise UnsupportedModel(f"model_type {family!r} is not supported{hint} ({', '.join(_FAMILIES)})")
    fam = _FAMILIES[family]
    act = hf.get("hidden_activation") or hf.get("hidden_act") or fam["act"]
    if act != fam["act"] or act not in _ACTIVATIONS:
        raise UnsupportedModel(f"{family}: activation {act!r} is not implemented (expected {fam['act']!r})")
    for key in ("mlp_bias", "use_bidirectional_attention", "attention_chunk_size", "use_qk_norm"):
        if hf.get(key):
            raise UnsupportedModel(f"{family}: {key} is not implemented")
    if hf.get("attention_bias") and family not in ("llama", "qwen2"):
        raise UnsupportedModel(f"{family}: attention biases are not implemented")
    n_layers = hf["num_hidden_layers"]
    gemma = family.startswith("gemma")
    # Rope: transformers 5 writes rope_parameters (per layer type for Gemma 3), older
    # configs rope_theta and rope_scaling (and Gemma 3 rope_local_base_freq).
    rp = hf.get("rope_parameters")
    local_theta = None
    if isinstance(rp, dict) and "full_attention" in rp:
        theta, scaling = _rope(rp["full_attention"], family)
        if "sliding_attention" in rp:
            local_theta, local_scaling = _rope(rp["sliding_attention"], family)
            if local_scaling is not None:
                raise UnsupportedModel(f"{family}: scaled RoPE on windowed layers is not implemented")
    elif isinstance(rp, dict):
        theta, scaling = _rope(rp, family)
    else:
        theta, scaling = _rope({"rope_theta": hf.get("rope_theta", 10000.0), **(hf.get("rope_scaling") or {}),
                                "partial_rotary_factor": hf.get("partial_rotary_factor", 1.0)}, family)
        if family == "gemma3_text":
            local_theta = float(hf.get("rope_local_base_freq", 10000.0))
    if family == "gemma3_text" and local_theta is None:
        local_theta = theta
    # Which layers see a sliding window.
    window = hf.get("sliding_window")
    if family in ("qwen2", "qwen3") and not hf.get("use_sliding_window"):
        window = None
    types = hf.get("layer_types")
    if types is not None:
        unknown = set(types) - {"full_attention", "sliding_attention"}
        if unknown or len(types) != n_layers:
            raise UnsupportedModel(f"{family}: layer types {sorted(unknown) or types} are not implemented")
        sliding = tuple(i for i, t in enumerate(types) if t == "sliding_attention")
    elif family in ("mistral", "phi3"):
        sliding = tuple(range(n_layers))
    elif family in ("qwen2", "qwen3"):
        sliding = tuple(range(hf.get("max_window_layers", n_layers), n_layers))
    elif gemma:
        pattern = hf.get("sliding_window_pattern", fam["pattern"])
        sliding = tuple(i for i in range(n_layers) if (i + 1) % pattern)
    else:
        sliding = ()
    if window is None or family == "llama":
        if family == "llama" and window:
            raise UnsupportedModel("llama: a sliding window is not part of this family")
        window, sliding = None, ()
    if window is not None and not sliding:
        window = None
    eos = hf.get("eos_token_id")
    eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))
    return ModelConfig(
        vocab_size=hf["vocab_size"],
        dim=hf["hidden_size"],
        n_layers=n_layers,
        n_heads=hf["num_attention_heads"],
        n_kv_heads=hf.get("num_key_value_heads") or hf["num_attention_heads"],
        ffn_dim=hf["intermediate_size"],
        norm_eps=hf.get("rms_norm_eps", 1e-6 if gemma else 1e-5),
        rope_theta=theta,
        rope_scaling=scaling,
        tie_embeddings=hf.get("tie_word_embeddings", fam.get("tie", False)),
        attention_bias=hf.get("attention_bias", family == "qwen2"),
        max_seq_len=hf.get("max_position_embeddings", 8192),
        bos_token_id=hf.get("bos_token_id"),
        eos_token_ids=eos_ids,
        head_vocab=(hf.get("sdcp_fast") or {}).get("head_vocab"),
        family=family,
        explicit_head_dim=_head_dim(hf),
        qk_norm=family in ("qwen3", "gemma3_text"),
        sliding_window=window,
        sliding_layers=sliding,
        rope_local_theta=local_theta,
        norm_unit_offset=gemma,
        post_norms=gemma,
        scale_embeddings=gemma,
        activation=_ACTIVATIONS[act],
        query_pre_attn_scalar=hf.get("query_pre_attn_scalar") if gemma else None,
        attn_softcap=hf.get("attn_logit_softcapping") if gemma else None,
        logit_softcap=hf.get("final_logit_softcapping") if gemma else None,
        fused_proj=family == "phi3",
    )


def _head_dim(hf: dict[str, Any]) -> int | None:
    hd = hf.get("head_dim")
    return None if hd is None or hd == hf["hidden_size"] // hf["num_attention_heads"] else int(hd)
