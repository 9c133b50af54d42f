"""Tiny random checkpoints of every family the loader reads, made with transformers (the
independent implementation) and saved as Hugging Face directories, with a byte-level
tokenizer and a jinja chat template of their own.

transformers is the ``[compare]`` extra, part of the dev set-up: where it is missing the
tests skip, except in CI (``CI`` set), where a skip would hide the check, so they fail.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest
import torch

VOCAB = 260  # 256 bytes, then <bos> <eos> <|im_start|> <|im_end|>
BOS, EOS = 256, 257
WINDOW = 8
COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
              bos_token_id=BOS, eos_token_id=EOS, pad_token_id=EOS, max_position_embeddings=512)
TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] | trim }}<|im_end|>\n"
            "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def require_transformers() -> None:
    if importlib.util.find_spec("transformers") is None:
        why = "transformers is not installed (extra [compare]); it is the independent implementation"
        if os.environ.get("CI"):
            pytest.fail(f"{why}: CI installs it (make test), so this check must run there")
        pytest.skip(why)


def hf_config(family: str):  # -> transformers.PretrainedConfig
    import transformers as tf

    if family == "llama":
        return tf.LlamaConfig(num_hidden_layers=2, rope_theta=500.0, **COMMON)
    if family == "llama3":  # Llama 3.x RoPE scaling, short enough to matter within the prompt
        rope = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 16, "rope_theta": 500.0}
        return tf.LlamaConfig(num_hidden_layers=2, rope_parameters=rope, **COMMON)
    if family == "qwen2":  # q/k/v biases; the second layer windowed
        return tf.Qwen2Config(num_hidden_layers=2, rope_theta=1000.0, use_sliding_window=True, sliding_window=WINDOW,
                              max_window_layers=1, **COMMON)
    if family == "qwen3":  # head_dim 32 != 64 / 4, q/k norms
        return tf.Qwen3Config(num_hidden_layers=2, head_dim=32, rope_theta=1000.0, tie_word_embeddings=True, **COMMON)
    if family == "mistral":
        return tf.MistralConfig(num_hidden_layers=2, sliding_window=WINDOW, rope_theta=1000.0, **COMMON)
    if family == "gemma2":  # small caps, so that soft-capping changes the numbers
        return tf.Gemma2Config(num_hidden_layers=3, head_dim=32, sliding_window=WINDOW, query_pre_attn_scalar=24,
                               attn_logit_softcapping=3.0, final_logit_softcapping=4.0, **COMMON)
    if family == "gemma3":
        rope = {"sliding_attention": {"rope_type": "default", "rope_theta": 1000.0},
                "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 20000.0}}
        return tf.Gemma3TextConfig(num_hidden_layers=3, head_dim=32, sliding_window=WINDOW, query_pre_attn_scalar=24,
                                   layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                                   rope_parameters=rope, **COMMON)
    if family == "phi3":
        return tf.Phi3Config(num_hidden_layers=2, sliding_window=12, **COMMON)
    raise ValueError(family)


def make_tokenizer():  # -> tokenizers.Tokenizer
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from tokenizers.pre_tokenizers import ByteLevel

    alphabet = ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet, key=lambda c: ord(c)))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], fuse_unk=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t in ("<bos>", "<eos>", "<|im_start|>", "<|im_end|>")])
    return tok


def make_checkpoint(family: str, path: Path, seed: int = 0, **overrides):
    """A random ``family`` model (transformers), saved to ``path`` in float32; returns it."""
    import transformers as tf

    cfg = hf_config(family)
    for k, v in overrides.items():
        setattr(cfg, k, v)
    torch.manual_seed(seed)
    cls = tf.Gemma3ForCausalLM if family == "gemma3" else tf.AutoModelForCausalLM
    model = cls.from_config(cfg, dtype=torch.float32) if cls is tf.AutoModelForCausalLM else cls(cfg)
    with torch.no_grad():  # larger than transformers' init, so that greedy choices are clear-cut
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(torch.empty_like(p).uniform_(-0.3, 0.3) + (0.0 if family.startswith("gemma") else 1.0))
            else:
                p.normal_(0, 0.25)
    model = model.eval()
    model.save_pretrained(str(path))
    make_tokenizer().save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<bos>", "eos_token": "<eos>",
        "pad_token": "<eos>", "chat_template": TEMPLATE}))
    return model


def hf_logits(model, tokens: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([tokens])).logits[0].float()  # [T, V]


def hf_greedy(model, prompt: list[int], max_new: int) -> list[int]:
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                             max_new_tokens=max_new, do_sample=False, eos_token_id=EOS, pad_token_id=EOS)
    return out[0, len(prompt):].tolist()


GGUF_ARCH = {"llama": "llama", "llama3": "llama", "qwen3": "qwen3", "phi3": "phi3", "gemma2": "gemma2",
             "gemma3": "gemma3"}


def write_gguf(model, family: str, path: Path) -> Path:
    """``model`` (transformers) as a float32 GGUF the way llama.cpp's converter lays it out:
    tensor names from the ``gguf`` package's own map, q/k rows permuted for ``llama``."""
    import gguf
    import numpy as np

    cfg = model.config
    arch = GGUF_ARCH[family]
    heads, kv = cfg.num_attention_heads, cfg.num_key_value_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH[arch.upper()], cfg.num_hidden_layers)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_dimension_count(head_dim)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    rope = cfg.rope_parameters
    if "full_attention" in rope:  # Gemma 3: the sliding layers' base, the global layers' scaling
        w.add_rope_freq_base_swa(float(rope["sliding_attention"]["rope_theta"]))
        rope = rope["full_attention"]
        if rope.get("rope_type") == "linear":
            w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
            w.add_rope_scaling_factor(rope["factor"])
    w.add_rope_freq_base(float(rope["rope_theta"]))
    if getattr(cfg, "sliding_window", None):
        w.add_sliding_window(cfg.sliding_window)
    if family.startswith("gemma"):
        w.add_sliding_window_pattern([t == "sliding_attention" for t in cfg.layer_types])
        if cfg.attn_logit_softcapping:
            w.add_attn_logit_softcapping(cfg.attn_logit_softcapping)
        if cfg.final_logit_softcapping:
            w.add_final_logit_softcapping(cfg.final_logit_softcapping)
    if rope.get("rope_type") == "llama3":  # llama.cpp stores the scaling as per-frequency factors
        factor, low, high = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
        old = rope["original_max_position_embeddings"]
        factors = []
        for freq in 1.0 / rope["rope_theta"] ** (np.arange(0, head_dim, 2) / head_dim):
            wavelen = 2 * np.pi / freq
            smooth = (old / wavelen - low) / (high - low)
            factors.append(1.0 if wavelen < old / high else factor if wavelen > old / low
                           else 1 / ((1 - smooth) / factor + smooth))
        w.add_tensor("rope_freqs.weight", np.array(factors, dtype=np.float32))
    tok = make_tokenizer()
    vocab = sorted(tok.get_vocab().items(), key=lambda kv_: kv_[1])
    w.add_tokenizer_model("gpt2")
    w.add_token_list([t for t, _ in vocab])
    w.add_token_types([3 if i >= 256 else 1 for _, i in vocab])
    w.add_eos_token_id(EOS)

    def permute(x: np.ndarray, n: int) -> np.ndarray:  # llama.cpp's convert script, for llama
        return x.reshape(n, 2, x.shape[0] // n // 2, *x.shape[1:]).swapaxes(1, 2).reshape(x.shape)

    for name, t in model.state_dict().items():
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        x = t.detach().float().numpy()
        if arch == "llama" and name.endswith("q_proj.weight"):
            x = permute(x, heads)
        elif arch == "llama" and name.endswith("k_proj.weight"):
            x = permute(x, kv)
        elif family.startswith("gemma") and name.endswith("norm.weight"):  # llama.cpp stores (1 + w)
            x = x + 1
        w.add_tensor(names.get_name(name, try_suffixes=(".weight", ".bias")), np.ascontiguousarray(x))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
