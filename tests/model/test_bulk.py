"""Bulk generation (left-padded rows, contiguous cache) against the paged runner."""

from __future__ import annotations

import pytest
import torch

from sdcp_fast.model.bulk import generate_rows
from sdcp_fast.model.target_scorer import ModelRunner, greedy_token

from .conftest import random_model

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA"))]


def greedy_alone(model, prompt: list[int], n: int, stop: tuple[int, ...] = ()) -> list[int]:
    r = ModelRunner(model, block_size=4)
    ctx, out = list(prompt), []
    for _ in range(n):
        tok = greedy_token(r.decode_one([(b"s", ctx)])[0])
        out.append(tok)
        ctx.append(tok)
        if tok in stop:
            break
    return out


@pytest.mark.parametrize("device", DEVICES)
def test_ragged_greedy_rows_equal_each_prompt_alone(device) -> None:
    model = random_model()
    prompts = [[5, 9, 1], [7], [3, 3, 3, 3, 3, 3, 8, 2], [40, 41]]
    want = [greedy_alone(model, p, 6) for p in prompts]
    got = generate_rows(model.to(device), prompts, 6, top_k=3)
    assert [r.tokens for r in got] == want
    for p, r in zip(prompts, got, strict=True):  # the labels are the logits that chose each token
        ref = ModelRunner(model.cpu(), block_size=4)
        for t, tok in enumerate(r.tokens):
            row = ref.decode_one([(b"s", p + r.tokens[:t])])[0]
            top = row.topk(3)
            assert r.top_ids[t].tolist() == top.indices.tolist() and r.top_ids[t, 0] == tok
            torch.testing.assert_close(r.top_logits[t].float(), top.values, atol=2e-2, rtol=1e-2)


def test_stop_token_ends_a_row_and_is_kept() -> None:
    model = random_model()
    prompts = [[5, 9, 1], [7], [12, 60]]
    free = [r.tokens for r in generate_rows(model, prompts, 8)]
    stop = free[0][2]  # the first row's third token
    got = [r.tokens for r in generate_rows(model, prompts, 8, stop=[stop])]
    for row, full in zip(got, free, strict=True):
        n = full.index(stop) + 1 if stop in full else len(full)
        assert row == full[:n]
    assert got[0][-1] == stop and len(got[0]) <= 3


@pytest.mark.parametrize("device", DEVICES)
def test_sampled_rows_follow_the_seed(device) -> None:
    model = random_model().to(device)
    prompts = [[1, 2, 3], [4]]

    def draw(seed: int) -> list[list[int]]:
        return [r.tokens for r in generate_rows(model, prompts, 5, temperature_milli=1000, top_p_milli=500,
                                                generator=torch.Generator().manual_seed(seed))]

    assert draw(1) == draw(1)
    assert any(draw(s) != draw(1) for s in range(2, 6))


def test_rejects_an_empty_prompt() -> None:
    with pytest.raises(ValueError):
        generate_rows(random_model(), [[1], []], 2)
