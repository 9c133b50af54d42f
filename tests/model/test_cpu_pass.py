"""The CPU pass's products against the modules they stand for: each quantized product equals
:meth:`QuantLinear.forward` (its bias included), and a whole pass of a model with q/k/v biases
(Qwen2's layout) gives the logits of the torch modules' pass."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from unittest import mock

import pytest
import torch

from sdcp_fast import native
from sdcp_fast.kernels import rowwise
from sdcp_fast.model import cpu_pass, quant_weights
from sdcp_fast.model.target_scorer import ModelRunner

from .conftest import SMALL, random_model

pytestmark = pytest.mark.skipif(not rowwise.available(), reason=native.status())

# Widths that are multiples of the 32-value block, so q/k/v are quantized with their biases.
QWEN2 = replace(SMALL, dim=64, n_heads=4, n_kv_heads=2, ffn_dim=96, attention_bias=True)
PROMPT = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3]


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _model(form: str, fuse: bool = True) -> torch.nn.Module:
    return quant_weights.quantize_model(random_model(QWEN2, seed=1), form, fuse=fuse)


@pytest.mark.parametrize("fuse", [True, False], ids=["fused", "apart"])
@pytest.mark.parametrize("form", ["q8_0", "q4"])
def test_quantized_products_equal_quant_linear_forward_bias_included(form: str, fuse: bool) -> None:
    model = _model(form, fuse)
    layers = [m for m in model.layers.modules() if isinstance(m, quant_weights.QuantLinear)]
    assert any(m.bias is not None for m in layers)
    g = torch.Generator().manual_seed(0)
    for mod in layers:
        x = torch.randn(5, mod.in_features, generator=g)
        assert torch.equal(cpu_pass._Linear(mod)(x, 1), mod(x)), mod


@pytest.mark.parametrize("form", ["q8_0", "q4"])
def test_quantized_pass_with_biases_gives_the_torch_modules_logits(form: str) -> None:
    model = _model(form)
    fast = ModelRunner(model, block_size=4).prefill(b"s", PROMPT)
    with mock.patch.object(cpu_pass, "usable", lambda *_: False):  # every layer through its module
        modules = ModelRunner(model, block_size=4).prefill(b"s", PROMPT)
    # Float rounding apart (attention, norms summed in another order), the same values.
    torch.testing.assert_close(fast, modules, rtol=0, atol=1e-3 * float(modules.abs().max()))


@pytest.mark.parametrize("how", ["storage", "parameter", "module"])
def test_a_replaced_weight_is_read_by_the_next_pass(how: str) -> None:
    """The plan holds weights by address: after a weight's storage, its parameter or its
    module is replaced, the next pass reads the new weight (the plan is rebuilt)."""
    model = random_model(QWEN2, seed=1)
    runner = ModelRunner(model, block_size=4)
    before = runner.prefill(b"a", PROMPT)
    attn = model.layers[0].attn
    new = torch.randn_like(attn.wo.weight)
    with torch.no_grad():
        if how == "storage":
            attn.wo.weight.data = new
        elif how == "parameter":
            attn.wo.weight = torch.nn.Parameter(new)
        else:
            wo = torch.nn.Linear(new.shape[1], new.shape[0], bias=False)
            wo.weight.copy_(new)
            attn.wo = wo
    fast = runner.prefill(b"b", PROMPT)
    with mock.patch.object(cpu_pass, "usable", lambda *_: False):
        modules = ModelRunner(model, block_size=4).prefill(b"s", PROMPT)
    torch.testing.assert_close(fast, modules, rtol=0, atol=1e-3 * float(modules.abs().max()))
    assert not torch.allclose(fast, before)


def test_a_product_splits_over_threads_only_from_parallel_from(monkeypatch) -> None:
    """A small product runs on the calling thread whatever the pass's threads (a fork and a
    join cost more than it); one of at least PARALLEL_FROM multiply-adds splits."""
    model = _model("q4")
    lin = cpu_pass._Linear(next(m for m in model.layers.modules() if isinstance(m, quant_weights.QuantLinear)))
    monkeypatch.setattr(cpu_pass, "PARALLEL_FROM", 3 * lin.n * lin.k)
    real = native.module()
    asked: list[int] = []

    class Spy:
        def quant_matmul(self, *args):  # type: ignore[no-untyped-def]
            asked.append(args[-1])
            return real.quant_matmul(*args)

    monkeypatch.setattr(cpu_pass, "_native", Spy)
    x = torch.randn(3, lin.k)
    split = lin(x, 2)
    one = lin(x[:2].contiguous(), 2)
    assert asked == [2, 1]
    assert torch.equal(split[:2], one)  # the same bits either way


def _decode_both(model: torch.nn.Module, monkeypatch: pytest.MonkeyPatch, steps: int = 24) -> None:
    """Greedy decoding of two sessions on two runners of one model, one pass captured and the
    other not at each step, with a verification pass every fourth: every logit the same."""
    from sdcp_fast.model.interfaces import ScoreRequest

    captured, plain = ModelRunner(model, block_size=4), ModelRunner(model, block_size=4)
    seqs = {b"a": list(PROMPT), b"b": PROMPT[:3]}
    for step in range(steps):
        batch = list(seqs.items())
        monkeypatch.setattr(cpu_pass, "CAPTURE_ROWS", 16)
        got = captured.decode_one(batch)
        monkeypatch.setattr(cpu_pass, "CAPTURE_ROWS", 0)
        assert torch.equal(got, plain.decode_one(batch)), step
        if step % 4 == 0:
            reqs = [ScoreRequest(s, c, [1, 2]) for s, c in batch]
            monkeypatch.setattr(cpu_pass, "CAPTURE_ROWS", 16)
            got_v = torch.cat(captured.score(reqs))
            monkeypatch.setattr(cpu_pass, "CAPTURE_ROWS", 0)
            assert torch.equal(got_v, torch.cat(plain.score(reqs))), step
        for (_, c), row in zip(batch, got, strict=True):
            c.append(int(row.argmax()))


def test_captured_passes_give_the_passes_logits_bit_for_bit(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pass of at most CAPTURE_ROWS rows replays its shape's native calls on buffers of its
    own; the cache's block table grows past the program's width on the way (block size 4)."""
    model = random_model(SMALL, seed=3)
    assert cpu_pass.plan(model).capturable
    _decode_both(model, monkeypatch)
    assert all(p.calls for p in cpu_pass.plan(model).programs.values())
    widths = {p.table.shape[1] for p in cpu_pass.plan(model).programs.values()}
    assert len(widths) > 1, widths  # rebuilt for a wider table


def test_a_model_whose_layers_add_biases_in_torch_is_not_captured(monkeypatch: pytest.MonkeyPatch) -> None:
    model = _model("q4")
    assert not cpu_pass.plan(model).capturable
    _decode_both(model, monkeypatch, steps=4)
    assert not cpu_pass.plan(model).programs


def test_a_program_in_use_on_another_thread_leaves_the_pass_to_the_plain_path(
        monkeypatch: pytest.MonkeyPatch) -> None:
    model = random_model(SMALL, seed=3)
    runner = ModelRunner(model, block_size=4)
    first = runner.prefill(b"s", PROMPT)  # 10 rows: a program of its own
    monkeypatch.setattr(cpu_pass, "CAPTURE_ROWS", 16)
    runner.release(b"s")
    assert torch.equal(runner.prefill(b"s", PROMPT), first)
    (prog,) = cpu_pass.plan(model).programs.values()
    calls = list(prog.calls)
    with prog.lock:  # another thread's pass
        runner.release(b"s")
        assert torch.equal(runner.prefill(b"s", PROMPT), first)
    assert prog.calls == calls
