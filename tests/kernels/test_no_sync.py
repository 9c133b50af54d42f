"""The triton backend reads no device value on the host: no ``.item()``, ``bool(tensor)``,
``.tolist()``, data-dependent shapes or copies back, anywhere between the API and the launch.

The check runs wherever the triton backend does (interpreted on CPU tensors, or on a GPU):
``params.on_host`` is patched to call every tensor a device tensor, and torch's host-reading
methods raise when our kernel code calls them. What a host check would reject comes back
as a flag instead (``bad``, accepted -1, NaN rows)."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import sdcp_fast.kernels as K
from sdcp_fast.kernels import params

from .inputs import draft, logits, ragged
from .support import backend_params, device_of

TRITON = backend_params("triton")
OURS = (str(Path(K.__file__).resolve().parent), str(Path(K.__file__).resolve().parents[2] / "triton_kernels"))
TENSOR_READS = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__", "cpu", "numpy", "nonzero", "any",
                "all", "unique", "masked_select")
TORCH_READS = ("nonzero", "repeat_interleave", "unique", "masked_select", "argwhere")


def _guarded(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        caller = sys._getframe(1).f_code.co_filename
        if caller.startswith(OURS):
            raise AssertionError(f"host read: {name} called from {caller}:{sys._getframe(1).f_lineno}")
        return original(*args, **kwargs)

    return wrapper


def _guarded_to(original: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        caller = sys._getframe(1).f_code.co_filename
        if caller.startswith(OURS) and ("cpu" in args or kwargs.get("device") == "cpu"):
            raise AssertionError(f"host read: .to('cpu') from {caller}:{sys._getframe(1).f_lineno}")
        return original(self, *args, **kwargs)

    return wrapper


@contextlib.contextmanager
def no_host_reads() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(params, "on_host", lambda t: False)
        for name in TENSOR_READS:
            mp.setattr(torch.Tensor, name, _guarded(name, getattr(torch.Tensor, name)))
        mp.setattr(torch.Tensor, "to", _guarded_to(torch.Tensor.to))
        for name in TORCH_READS:
            mp.setattr(torch, name, _guarded(name, getattr(torch, name)))
        yield


def test_the_guard_catches_a_host_read() -> None:
    with no_host_reads(), pytest.raises(AssertionError, match="host read"):
        params.ragged(torch.zeros(3, 4), torch.zeros(2, dtype=torch.int64), torch.tensor([0, 2]))


def _batch(dev: torch.device, ms: list[int], vocab: int = 200, seed: int = 0) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(seed)
    x = logits(gen, sum(ms) + len(ms), vocab)
    q, tokens = draft(gen, torch.softmax(x.double(), 1), ms, "close")
    u = torch.rand(len(ms), max(ms) + 1, 2, generator=gen, dtype=torch.float64)
    b = len(ms)
    return {k: v.to(dev) for k, v in dict(
        target_logits=x, temperature_milli=torch.tensor([0, 700, 1000, 1300][:b]),
        top_k=torch.tensor([0, 20, 0, 5][:b]), top_p_milli=torch.tensor([0, 900, 500, 0][:b]), q_probs=q,
        draft_tokens=tokens, cu_draft=ragged(ms), uniforms=u).items()}


def _equal(got: tuple[torch.Tensor, ...], want: tuple[torch.Tensor, ...]) -> bool:
    return all(torch.equal(g.cpu(), w.cpu()) for g, w in zip(got, want, strict=True))


@pytest.mark.parametrize("backend", TRITON)
def test_verify_speculative_reads_nothing_on_the_host(backend: str) -> None:
    args = _batch(device_of(backend), [3, 1, 4, 2])
    want = K.verify_speculative(**{k: v.cpu() for k, v in args.items()}, backend="reference")
    with no_host_reads():
        got = K.verify_speculative(**args, backend=backend)
        scalar = K.verify_speculative(**{**args, "temperature_milli": 700, "top_k": 20, "top_p_milli": None},
                                      backend=backend)
    assert _equal(got, want)
    cpu = {k: v.cpu() for k, v in args.items()}
    assert _equal(scalar, K.verify_speculative(**{**cpu, "temperature_milli": 700, "top_k": 20, "top_p_milli": None},
                                               backend="reference"))


@pytest.mark.parametrize("backend", TRITON)
def test_verify_greedy_and_sampling_read_nothing_on_the_host(backend: str) -> None:
    args = _batch(device_of(backend), [3, 1, 4, 2])
    x, tokens, cu = args["target_logits"], args["draft_tokens"], args["cu_draft"]
    u = torch.rand(x.shape[0], dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    temps = args["temperature_milli"].repeat_interleave(torch.tensor([4, 2, 5, 3], device=x.device))
    with no_host_reads():
        accepted, emitted = K.verify_greedy(x, tokens, cu, backend=backend, max_draft=4)
        probs = K.apply_sampling_profile(x, temps, top_k=7, backend=backend)
        drawn = K.sample_from_probs(probs, u.to(x.device), backend=backend)
    want = K.verify_greedy(x.cpu(), tokens.cpu(), cu.cpu(), backend="reference")
    assert torch.equal(accepted.cpu(), want[0]) and torch.equal(emitted.cpu(), want[1])
    want_probs = K.apply_sampling_profile(x.cpu(), temps.cpu(), top_k=7, backend="reference")
    assert torch.equal(probs.cpu() == 0, want_probs == 0)
    torch.testing.assert_close(probs.cpu(), want_probs, rtol=2e-5, atol=1e-7)
    assert torch.equal(drawn.cpu(), K.sample_from_probs(want_probs, u, backend="reference"))


@pytest.mark.parametrize("backend", TRITON)
def test_what_the_host_would_reject_comes_back_flagged(backend: str) -> None:
    dev = device_of(backend)
    args = _batch(dev, [3, 1, 4, 2])
    tokens = args["draft_tokens"].clone()
    tokens[3] = 10_000  # session 1: a token id outside the vocabulary
    profile = args["top_k"].clone()
    profile[3] = -1  # session 3: a negative profile entry
    with no_host_reads():
        _, emitted, bad = K.verify_speculative(**{**args, "draft_tokens": tokens, "top_k": profile}, backend=backend)
        narrow = K.verify_speculative(**{**args, "uniforms": args["uniforms"][:, :4]}, backend=backend)
        shifted = K.verify_speculative(**{**args, "cu_draft": args["cu_draft"] + 1}, backend=backend)
        accepted_g, emitted_g = K.verify_greedy(args["target_logits"], args["draft_tokens"], args["cu_draft"],
                                                backend=backend, max_draft=3)
        probs = K.apply_sampling_profile(args["target_logits"][:4], top_k=torch.tensor([0, -2, 3, 0], device=dev),
                                         backend=backend)
    assert bad.cpu().tolist() == [False, True, False, True]
    assert (emitted.cpu()[[1, 3]] == -1).all()
    assert narrow[2].cpu().tolist() == [False, False, True, False]  # M_b + 1 = 5 does not fit width 4
    assert shifted[2].cpu().all()  # cu_draft must start at 0 and end at D
    assert accepted_g.cpu()[2] == -1 and (emitted_g.cpu()[2] == -1).all() and emitted_g.shape == (4, 4)
    assert probs.cpu()[1].isnan().all() and not probs.cpu()[[0, 2, 3]].isnan().any()


@pytest.mark.parametrize("backend", TRITON)
def test_paged_attention_reads_nothing_on_the_host(backend: str) -> None:
    dev = device_of(backend)
    gen = torch.Generator().manual_seed(3)
    cache_k = torch.randn(6, 4, 2, 16, generator=gen)
    cache_v = torch.randn(6, 4, 2, 16, generator=gen)
    args = dict(q=torch.randn(4, 4, 16, generator=gen), k_cache=cache_k, v_cache=cache_v,
                block_table=torch.tensor([[5, 0, 2], [3, 1, -1]], dtype=torch.int32),
                seq_lens=torch.tensor([10, 6], dtype=torch.int32), cu_q=torch.tensor([0, 3, 4]))
    want = K.paged_attention(**args, backend="reference")
    with no_host_reads():
        got = K.paged_attention(**{k: v.to(dev) for k, v in args.items()}, backend=backend)
    torch.testing.assert_close(got.cpu(), want, rtol=1e-4, atol=1e-5)
