"""The triton entry points capture into a CUDA graph: a replay on new input values gives what
an eager call on those values gives. Needs a GPU (bench/gpu_check.sh runs it there)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import sdcp_fast.kernels as K

from .inputs import draft, logits, ragged
from .support import backend_params, device_of

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or device_of("triton").type != "cuda",
    reason="CUDA graphs need a CUDA device (and the triton backend compiled, not interpreted)")
TRITON = backend_params("triton")
MS = [3, 1, 8, 2, 5]


def _inputs(seed: int, vocab: int = 32000) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    x = logits(gen, sum(MS) + len(MS), vocab)
    q, tokens = draft(gen, torch.softmax(x.double(), 1), MS, "close")
    u = torch.rand(len(MS), max(MS) + 1, 2, generator=gen, dtype=torch.float64)
    return {k: v.cuda() for k, v in dict(target_logits=x, q_probs=q, draft_tokens=tokens, cu_draft=ragged(MS),
                                         uniforms=u, u_rows=torch.rand(x.shape[0], generator=gen,
                                                                        dtype=torch.float64)).items()}


def _capture(fn: Callable[[], Any]) -> tuple[torch.cuda.CUDAGraph, Any]:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up: triton compiles outside the capture
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out


def _same(a: Any, b: Any) -> bool:
    a = a if isinstance(a, tuple) else (a,)
    b = b if isinstance(b, tuple) else (b,)
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("backend", TRITON)
@pytest.mark.parametrize("entry", ["speculative", "speculative_scalar", "greedy", "profile", "sample", "attention"])
def test_capture_and_replay_equal_eager(backend: str, entry: str) -> None:
    live = _inputs(0)
    prof = dict(temperature_milli=torch.tensor([0, 700, 1000, 1300, 900], device="cuda"),
                top_k=torch.tensor([0, 50, 0, 5, 20], device="cuda"),
                top_p_milli=torch.tensor([0, 900, 500, 0, 950], device="cuda"))
    rows = live["target_logits"].shape[0]
    row_prof = {k: v.repeat_interleave(torch.tensor(MS, device="cuda") + 1, output_size=rows)
                for k, v in prof.items()}

    def call() -> Any:
        if entry == "speculative":
            return K.verify_speculative(live["target_logits"], prof["temperature_milli"], prof["top_k"],
                                        prof["top_p_milli"], live["q_probs"], live["draft_tokens"], live["cu_draft"],
                                        live["uniforms"], backend=backend)
        if entry == "speculative_scalar":
            return K.verify_speculative(live["target_logits"], 800, 40, 950, live["q_probs"], live["draft_tokens"],
                                        live["cu_draft"], live["uniforms"], backend=backend)
        if entry == "attention":  # the target logits as 16 query rows of 2 x 16 (T, H, D), a 4-block cache
            q = live["target_logits"][:, :512].reshape(-1, 2, 16)[:16]
            cache = live["q_probs"][:, :1024].reshape(-1, 4, 2, 16)[:6].contiguous()
            table = torch.tensor([[5, 0, 2, 4], [3, 1, 0, 2]], dtype=torch.int32, device="cuda")
            return K.paged_attention(q, cache, cache, table, torch.tensor([14, 9], dtype=torch.int32, device="cuda"),
                                     torch.tensor([0, 10, 16], device="cuda"), backend=backend)
        if entry == "greedy":
            return K.verify_greedy(live["target_logits"], live["draft_tokens"], live["cu_draft"], backend=backend,
                                   max_draft=max(MS))
        probs = K.apply_sampling_profile(live["target_logits"], **row_prof, backend=backend)
        return probs if entry == "profile" else K.sample_from_probs(probs, live["u_rows"], backend=backend)

    graph, captured = _capture(call)
    for seed in (1, 2):
        for name, value in _inputs(seed).items():
            live[name].copy_(value)
        graph.replay()
        torch.cuda.synchronize()
        assert _same(captured, call()), f"replay {seed} differs from eager"
