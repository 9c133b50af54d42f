"""A checkpoint whose architecture or feature the model does not implement is refused at
load with a clear error (never served as another function under its digest)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from sdcp_fast.cli import main
from sdcp_fast.model import loader
from sdcp_fast.model.config import ModelConfig, UnsupportedModel

from .conftest import random_model

BASE = {"model_type": "llama", "vocab_size": 97, "hidden_size": 48, "num_hidden_layers": 2, "num_attention_heads": 6,
        "num_key_value_heads": 2, "intermediate_size": 80, "hidden_act": "silu"}

REFUSED = [  # (changes to a Llama config, words of the error)
    ({"model_type": "gpt_neox"}, "model_type 'gpt_neox' is not supported"),
    ({"model_type": "gemma3"}, "model_type 'gemma3' is not supported"),  # the multimodal wrapper
    ({"model_type": None}, "model_type None is not supported"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope type 'yarn'"),
    ({"model_type": "phi3", "rope_scaling": {"type": "longrope", "short_factor": [1.0]}}, "rope type 'longrope'"),
    ({"model_type": "qwen3", "rope_parameters": {"rope_type": "dynamic", "factor": 2.0}}, "rope type 'dynamic'"),
    ({"partial_rotary_factor": 0.5}, "partial rotary"),
    ({"hidden_act": "gelu"}, "activation 'gelu'"),
    ({"model_type": "gemma2", "hidden_activation": "silu"}, "activation 'silu'"),
    ({"mlp_bias": True}, "mlp_bias"),
    ({"model_type": "mistral", "attention_bias": True}, "attention biases"),
    ({"model_type": "gemma3_text", "hidden_act": None, "use_bidirectional_attention": True},
     "use_bidirectional_attention"),
    ({"model_type": "mistral", "sliding_window": 4, "layer_types": ["chunked_attention", "full_attention"]},
     "layer types"),
    ({"sliding_window": 4}, "sliding window"),
]


@pytest.mark.parametrize(("changes", "words"), REFUSED)
def test_unsupported_configs_are_refused(changes, words) -> None:
    with pytest.raises(UnsupportedModel, match=words.replace("(", r"\(")):
        ModelConfig.from_hf({**BASE, **changes})


def test_supported_features_are_read() -> None:
    mistral = ModelConfig.from_hf({**BASE, "model_type": "mistral", "sliding_window": 4})
    assert mistral.sliding_layers == (0, 1) and mistral.window(1) == 4
    qwen = ModelConfig.from_hf({**BASE, "model_type": "qwen2", "use_sliding_window": True, "sliding_window": 4,
                                "max_window_layers": 1})
    assert qwen.sliding_layers == (1,) and qwen.attention_bias
    assert ModelConfig.from_hf({**BASE, "model_type": "qwen2", "sliding_window": 4}).sliding_window is None
    gemma3 = ModelConfig.from_hf({**BASE, "model_type": "gemma3_text", "hidden_act": None, "num_hidden_layers": 7,
                                  "head_dim": 16,
                                  "sliding_window": 4, "rope_theta": 1e6, "rope_local_base_freq": 1e4,
                                  "rope_scaling": {"rope_type": "linear", "factor": 8.0}})
    assert gemma3.sliding_layers == (0, 1, 2, 3, 4, 6) and gemma3.rope_local_theta == 1e4
    assert gemma3.rope_scaling == {"rope_type": "linear", "factor": 8.0} and gemma3.tie_embeddings
    assert gemma3.qk_norm and gemma3.norm_unit_offset and gemma3.activation == "gelu_tanh"


def test_tensors_the_model_lacks_are_refused_not_dropped(tmp_path) -> None:
    loader.save_hf_dir(random_model(), tmp_path, dtype=torch.float32)
    state = load_file(str(tmp_path / "model.safetensors"))
    state["model.layers.0.self_attn.o_proj.bias"] = torch.zeros(48)  # Llama with attention_bias: o_proj has one
    save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(UnsupportedModel, match="o_proj.bias"):
        loader.load(tmp_path)


def test_phi3_without_fused_weights_is_refused_by_name(tmp_path) -> None:
    loader.save_hf_dir(random_model(), tmp_path, dtype=torch.float32)
    hf = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**hf, "model_type": "phi3"}))
    with pytest.raises(UnsupportedModel, match="q_proj"):  # Phi-3 has qkv_proj: q_proj is unknown to it
        loader.load(tmp_path)


def test_generate_says_why_it_refuses(tmp_path, capsys) -> None:
    loader.save_hf_dir(random_model(), tmp_path, dtype=torch.float32)
    hf = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**hf, "model_type": "falcon"}))
    assert main(["generate", "--model", str(tmp_path), "--prompt", "hi", "--drafter", "none", "--raw"]) == 2
    assert "model_type 'falcon' is not supported" in capsys.readouterr().err
