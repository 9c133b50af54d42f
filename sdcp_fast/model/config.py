"""Model shapes: one dataclass for every Llama-family checkpoint we read."""

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

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["eos_token_ids"] = list(self.eos_token_ids)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelConfig:
        d = dict(d)
        d["eos_token_ids"] = tuple(d.get("eos_token_ids") or ())
        return cls(**d)

    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> ModelConfig:
        """From a Hugging Face ``config.json`` of a Llama, SmolLM2 or Qwen2 model."""
        eos = hf.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))
        return cls(
            vocab_size=hf["vocab_size"],
            dim=hf["hidden_size"],
            n_layers=hf["num_hidden_layers"],
            n_heads=hf["num_attention_heads"],
            n_kv_heads=hf.get("num_key_value_heads") or hf["num_attention_heads"],
            ffn_dim=hf["intermediate_size"],
            norm_eps=hf.get("rms_norm_eps", 1e-5),
            rope_theta=hf.get("rope_theta", 10000.0),
            rope_scaling=hf.get("rope_scaling"),
            tie_embeddings=hf.get("tie_word_embeddings", False),
            attention_bias=hf.get("attention_bias", hf.get("model_type") == "qwen2"),
            max_seq_len=hf.get("max_position_embeddings", 8192),
            bos_token_id=hf.get("bos_token_id"),
            eos_token_ids=eos_ids,
            head_vocab=(hf.get("sdcp_fast") or {}).get("head_vocab"),
        )

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
