"""CUDA graphs of the runner's decode and verify passes: replay equals eager, per bucket, and a
step reads nothing back on the host. The graph tests need a CUDA device; on CPU the same
scenarios run through the graph bank with a stand-in capture (padding, buckets, static
buffers), and test_paged_attention.py checks the padded layout under the triton interpreter."""

from __future__ import annotations

import copy

import pytest
import torch

from sdcp_fast.model.cuda_graphs import DEFAULT_BUCKETS, GraphBank, bucket_for, width_for
from sdcp_fast.model.interfaces import ScoreRequest
from sdcp_fast.model.target_scorer import ModelRunner

ATOL = 1e-4
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")


def seq(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 97, (n,), generator=g).tolist()


def test_buckets_and_widths() -> None:
    assert [bucket_for(b, DEFAULT_BUCKETS) for b in (1, 3, 5, 17, 64, 65, 256)] == [1, 4, 8, 24, 64, 80, 256]
    assert bucket_for(257, DEFAULT_BUCKETS) is None
    assert [width_for(n) for n in (1, 2, 3, 8, 9)] == [1, 2, 4, 8, 16]


@pytest.fixture
def cuda_model(small_model):
    return copy.deepcopy(small_model).to("cuda")


def eager_capture(step):
    """A stand-in for a CUDA graph on CPU: replay runs the step again into the same buffer."""
    out = step()
    return (lambda: out.copy_(step())), out


def graphed_on_cpu(model, **kw) -> ModelRunner:
    """A CPU runner whose decode and verify passes go through the graph bank's padding,
    buckets and static buffers, replayed eagerly (reference attention: fast on CPU)."""
    r = ModelRunner(model, attention="reference", **kw)
    r.graphs = GraphBank(model, r.cache, r.n_layers, attention="reference", capture=eager_capture)
    return r


def decode_scenario(graphed: ModelRunner, eager: ModelRunner) -> None:
    seqs = {b"a": seq(5, 1), b"b": seq(12, 2), b"c": seq(1, 3)}
    for r in (graphed, eager):
        for s, p in seqs.items():
            r.prefill(s, p)
    for step in range(12):  # batch 3 in bucket 4, then 2 in bucket 2; table widths 2, 4, 8
        batch = [(s, c) for s, c in seqs.items() if step < 6 or s != b"c"]
        want, got = eager.decode_one(batch), graphed.decode_one(batch)
        torch.testing.assert_close(got, want, atol=ATOL, rtol=0)
        for (s, c), row in zip(batch, want, strict=True):
            seqs[s] = [*c, int(row.argmax())]
    assert graphed.graphs is not None and graphed.graphs.captures >= 3


def verify_scenario(graphed: ModelRunner, eager: ModelRunner) -> None:
    committed = {b"a": seq(9, 4), b"b": seq(3, 5)}
    for r in (graphed, eager):
        for s, c in committed.items():
            r.prefill(s, c)
    for rnd in range(4):
        reqs = [ScoreRequest(s, c, seq(4, 10 * rnd + i)) for i, (s, c) in enumerate(committed.items())]
        want, got = eager.score(reqs), graphed.score(reqs)
        for w, g in zip(want, got, strict=True):
            assert g.shape == (5, 97)
            torch.testing.assert_close(g, w, atol=ATOL, rtol=0)
        # accept the first rnd tokens, then a correction: the next pass is M + 1 rows again
        for r in reqs:
            committed[r.session] = [*r.committed, *r.proposal[:rnd], 11]
    assert graphed.graphs is not None
    captured = graphed.graphs.captures
    ragged = [ScoreRequest(b"a", committed[b"a"], seq(2, 50)), ScoreRequest(b"b", committed[b"b"], seq(4, 51))]
    for w, g in zip(eager.score(ragged), graphed.score(ragged), strict=True):
        torch.testing.assert_close(g, w, atol=ATOL, rtol=0)
    assert graphed.graphs.captures == captured  # a ragged round runs eagerly


def test_graph_bank_decode_on_cpu(small_model) -> None:
    decode_scenario(graphed_on_cpu(small_model, block_size=4, num_blocks=4),
                    ModelRunner(small_model, block_size=4, num_blocks=4))


def test_graph_bank_verify_on_cpu(small_model) -> None:
    verify_scenario(graphed_on_cpu(small_model, block_size=4), ModelRunner(small_model, block_size=4))


@needs_cuda
@pytest.mark.gpu
def test_decode_replay_equals_eager(cuda_model) -> None:
    graphed = ModelRunner(cuda_model, block_size=4, num_blocks=4)  # the pool grows: graphs are captured again
    eager = ModelRunner(cuda_model, block_size=4, num_blocks=4, cuda_graphs=False)
    assert graphed.graphs is not None and graphed.attention == "triton" and eager.graphs is None
    decode_scenario(graphed, eager)


@needs_cuda
@pytest.mark.gpu
def test_verify_replay_equals_eager_and_ragged_rounds_run_eagerly(cuda_model) -> None:
    verify_scenario(ModelRunner(cuda_model, block_size=4), ModelRunner(cuda_model, block_size=4, cuda_graphs=False))


@needs_cuda
@pytest.mark.gpu
def test_a_replayed_step_does_not_sync(cuda_model) -> None:
    r = ModelRunner(cuda_model, block_size=4)
    r.prefill(b"a", seq(7, 6))
    r.decode_one([(b"a", [*seq(7, 6), 1])])  # captures
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = r.decode_one([(b"a", [*seq(7, 6), 1, 2])])  # replays
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert out.shape == (1, 97) and out.is_cuda
