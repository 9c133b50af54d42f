"""Hypothesis: the native backends equal the reference on arbitrary small inputs (ragged
batches with empty proposals, V = 1, ties, -inf logits, every profile member)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sdcp_fast.kernels import apply_sampling_profile, verify_greedy, verify_speculative

from .support import backend_params, call

CPU = backend_params("cpu")
LOGIT = st.one_of(st.integers(-3, 3).map(float), st.floats(-20, 20, width=32), st.just(float("-inf")))


@st.composite
def batches(draw: st.DrawFn) -> dict[str, object]:
    vocab = draw(st.integers(1, 40))
    ms = draw(st.lists(st.integers(0, 5), min_size=1, max_size=4))
    rows = sum(ms) + len(ms)
    flat = draw(st.lists(LOGIT, min_size=rows * vocab, max_size=rows * vocab))
    logits = torch.tensor(flat, dtype=torch.float32).reshape(rows, vocab)
    logits[:, draw(st.integers(0, vocab - 1))] = 0.0  # every row has a finite entry
    logits = logits.to(draw(st.sampled_from([torch.float32, torch.bfloat16])))
    seed = draw(st.integers(0, 2**31))
    gen = torch.Generator().manual_seed(seed)
    q = torch.softmax(torch.randn(sum(ms), vocab, generator=gen) * 2, dim=1)
    tokens = torch.multinomial(q, 1, generator=gen).squeeze(1) if sum(ms) else torch.zeros(0, dtype=torch.int64)
    cu = torch.tensor([0, *torch.tensor(ms).cumsum(0).tolist()])
    u = torch.rand(len(ms), max(ms) + 1, 2, generator=gen, dtype=torch.float64)
    profile = dict(temperature_milli=draw(st.sampled_from([None, 0, 1, 500, 1000, 3000])),
                   top_k=draw(st.sampled_from([None, 0, 1, 2, 5, 100])),
                   top_p_milli=draw(st.sampled_from([None, 0, 1, 300, 999, 1000])))
    return dict(logits=logits, q=q, tokens=tokens, cu=cu, u=u, profile=profile)


def _check(backend: str, batch: dict) -> None:
    logits, prof = batch["logits"], batch["profile"]
    want = apply_sampling_profile(logits, **prof, backend="reference")
    got = call(apply_sampling_profile, logits, **prof, backend=backend)
    assert torch.equal(got == 0, want == 0)
    torch.testing.assert_close(got, want, rtol=2e-5, atol=1e-7)
    g_want = verify_greedy(logits, batch["tokens"], batch["cu"], backend="reference")
    g_got = call(verify_greedy, logits, batch["tokens"], batch["cu"], backend=backend)
    assert all(torch.equal(a, b) for a, b in zip(g_got, g_want, strict=True))
    args = (logits, prof["temperature_milli"], prof["top_k"], prof["top_p_milli"], batch["q"], batch["tokens"],
            batch["cu"], batch["u"])
    s_want = verify_speculative(*args, backend="reference")
    s_got = call(verify_speculative, *args, backend=backend)
    # Random uniforms sit within 1e-6 of a boundary with probability ~1e-6 per decision.
    assert all(torch.equal(a, b) for a, b in zip(s_got, s_want, strict=True))


@pytest.mark.parametrize("backend", CPU)
@settings(max_examples=150, deadline=None)
@given(batch=batches())
def test_cpu_equals_reference(backend: str, batch: dict) -> None:
    _check(backend, batch)


@pytest.mark.parametrize("backend", backend_params("triton"))
@settings(max_examples=12, deadline=None)  # the interpreter is slow; a GPU runs the same few
@given(batch=batches())
def test_triton_equals_reference(backend: str, batch: dict) -> None:
    _check(backend, batch)
