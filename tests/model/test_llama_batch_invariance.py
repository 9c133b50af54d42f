"""Batch invariance of a CPU pass: the logits of position i from a pass over M + 1 positions
(a verification pass), or from a pass that also carries other sessions' rows, are bit-equal to
those of a one-position pass, at f32 and at the quantized forms (whose int8-rounded
activations would turn any float difference into a flipped near-tie)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pytest
import torch

from sdcp_fast import native
from sdcp_fast.kernels import rowwise
from sdcp_fast.model import quant_weights
from sdcp_fast.model.interfaces import ScoreRequest
from sdcp_fast.model.target_scorer import ModelRunner

from .conftest import SMALL, random_model

pytestmark = pytest.mark.skipif(not rowwise.available(), reason=native.status())

Q32 = replace(SMALL, dim=64, n_heads=4, n_kv_heads=2, ffn_dim=96)
# Odd shapes: widths and heads that are not multiples of the vector width or of 32 (those
# layers stay float at q4), GQA 5:1, a bias, Qwen3-style q/k norms.
ODD = replace(SMALL, vocab_size=61, dim=40, n_heads=5, n_kv_heads=1, ffn_dim=72, attention_bias=True)
QK = replace(Q32, qk_norm=True, n_heads=2, n_kv_heads=1)
PROMPT = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3]
PROPOSAL = [5, 8, 9, 7, 9]


@pytest.fixture(autouse=True)
def threads() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(2)  # the row-invariant kernels promise the same bits at any thread count
    yield
    torch.set_num_threads(before)


def _model(cfg, form: str):  # type: ignore[no-untyped-def]
    model = random_model(cfg, seed=1)
    if form != "f32":
        quant_weights.quantize_model(model, form)
    return model


def _one_at_a_time(model, prompt: list[int], extra: list[int]) -> torch.Tensor:  # type: ignore[no-untyped-def]
    """Logits after ``prompt + extra[:i]`` for each i, each from a one-position pass."""
    runner = ModelRunner(model, block_size=4)
    rows = [runner.prefill(b"s", prompt)]
    for i in range(len(extra)):
        rows.append(runner.decode_one([(b"s", prompt + extra[: i + 1])])[0])
    return torch.stack(rows)


@pytest.mark.parametrize("form", ["f32", "q8_0", "q4"])
@pytest.mark.parametrize("cfg", [Q32, ODD, QK], ids=["q32", "odd", "qk_norm"])
def test_verification_pass_rows_equal_one_position_passes(cfg, form: str) -> None:  # type: ignore[no-untyped-def]
    model = _model(cfg, form)
    want = _one_at_a_time(model, PROMPT, PROPOSAL)  # [M + 2, V]
    runner = ModelRunner(model, block_size=4)
    runner.prefill(b"s", PROMPT)
    got = runner.score([ScoreRequest(b"s", PROMPT, PROPOSAL)])[0]  # [M + 1, V]
    assert torch.equal(got, want[: len(PROPOSAL) + 1])
    # Prefill in one pass vs one position at a time: the cache holds the same bits as well.
    runner = ModelRunner(model, block_size=4)
    runner.prefill(b"s", PROMPT[:1])
    for i in range(2, len(PROMPT) + 1):
        last = runner.decode_one([(b"s", PROMPT[:i])])[0]
    assert torch.equal(last, want[0])


@pytest.mark.parametrize("form", ["f32", "q4"])
def test_rows_do_not_depend_on_other_sessions_in_the_pass(form: str) -> None:
    model = _model(Q32, form)
    others = [[7, 7, 8], [2] * 13]
    runner = ModelRunner(model, block_size=4)
    for i, p in enumerate(others):
        runner.prefill(bytes([i]), p)
    runner.prefill(b"s", PROMPT)
    batch = [ScoreRequest(bytes([0]), others[0], [1, 2]), ScoreRequest(b"s", PROMPT, PROPOSAL[:3]),
             ScoreRequest(bytes([1]), others[1], [])]
    got = runner.score(batch)[1]
    assert torch.equal(got, _one_at_a_time(model, PROMPT, PROPOSAL[:3]))
