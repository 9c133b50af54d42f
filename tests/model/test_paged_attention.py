"""The model's paged path (``paged_attention`` reads K and V through the block table) against
the gather + SDPA path, the plain reference forward and ``forward_dense``; the padded layout
a CUDA graph replays.

Without a GPU the triton kernel runs on CPU tensors through triton's interpreter (set in
conftest.py), so the shapes stay small."""

from __future__ import annotations

import copy

import pytest
import torch

from sdcp_fast.model.batch_layout import BatchLayout
from sdcp_fast.model.interfaces import ScoreRequest
from sdcp_fast.model.kv_cache import PagedKVCache
from sdcp_fast.model.target_scorer import ModelRunner

from .reference import dense_logits

ATOL = 1e-4
PAGED = ["reference", "triton"]
CUDA = torch.cuda.is_available()


def on_its_device(model, attention: str):
    """The model where ``attention`` runs: triton on the GPU where there is one (else under
    the interpreter on CPU tensors), the reference on CPU."""
    return copy.deepcopy(model).to("cuda") if attention == "triton" and CUDA else model


def seq(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 97, (n,), generator=g).tolist()


@pytest.mark.parametrize("attention", PAGED)
def test_verify_and_decode_equal_the_sdpa_path(small_model, attention: str) -> None:
    model = on_its_device(small_model, attention)
    paged = ModelRunner(model, block_size=4, num_blocks=3, attention=attention, cuda_graphs=False)  # the pool grows
    sdpa = ModelRunner(model, block_size=4, num_blocks=3, attention="sdpa")
    assert paged.attention == attention and sdpa.attention == "sdpa"
    # Ragged verify rows (M + 1 = 5, 1, 3), lengths across block boundaries, one prompt of 1 token.
    reqs = [ScoreRequest(b"a", seq(11, 1), seq(4, 2)), ScoreRequest(b"b", seq(17, 3), []),
            ScoreRequest(b"c", seq(1, 4), seq(2, 5))]
    for want, got, r in zip(sdpa.score(reqs), paged.score(reqs), reqs, strict=True):
        torch.testing.assert_close(got, want, atol=ATOL, rtol=0)
        ref = dense_logits(small_model, [*r.committed, *r.proposal])[len(r.committed) - 1:]
        torch.testing.assert_close(got.cpu(), ref, atol=ATOL, rtol=0)
        dense = small_model.logits(small_model.forward_dense(torch.tensor([[*r.committed, *r.proposal]])))[0]
        torch.testing.assert_close(got.cpu(), dense[len(r.committed) - 1:], atol=ATOL, rtol=0)
    # Next round: two of a's proposal accepted plus a correction, b decodes, c forks.
    a = reqs[0].committed + reqs[0].proposal[:2] + [7]
    nxt = [ScoreRequest(b"a", a, seq(3, 6)), ScoreRequest(b"b", reqs[1].committed + [9], seq(4, 7)),
           ScoreRequest(b"c", [5, 6, 7], [])]
    for want, got in zip(sdpa.score(nxt), paged.score(nxt), strict=True):
        torch.testing.assert_close(got, want, atol=ATOL, rtol=0)
    batch = [(b"a", a + [1]), (b"b", reqs[1].committed + [9, 2]), (b"c", [5, 6, 7, 8])]
    torch.testing.assert_close(paged.decode_one(batch), sdpa.decode_one(batch), atol=ATOL, rtol=0)
    torch.testing.assert_close(paged.prefill(b"d", seq(6, 8)).cpu(), dense_logits(small_model, seq(6, 8))[-1],
                               atol=ATOL, rtol=0)


@pytest.mark.parametrize("attention", PAGED)
def test_layer_skip_on_the_paged_path(small_model, attention: str) -> None:
    r = ModelRunner(on_its_device(small_model, attention), n_layers=1, block_size=4, attention=attention)
    prompt = seq(9, 9)
    torch.testing.assert_close(r.prefill(b"a", prompt).cpu(), dense_logits(small_model, prompt, n_layers=1)[-1],
                               atol=ATOL, rtol=0)


def _cache(model, blocks: int = 16) -> PagedKVCache:
    cfg = model.cfg
    return PagedKVCache(cfg.n_layers, cfg.n_kv_heads, cfg.head_dim, block_size=4, num_blocks=blocks,
                        device=model.embed.weight.device)


@pytest.mark.parametrize("attention", PAGED)
def test_padded_layout_equals_the_exact_one(small_model, attention: str) -> None:
    """What a CUDA graph replays: the batch padded to its bucket with sessions that write
    nothing, the table to a wider width; the real rows and the cache come out the same."""
    model = on_its_device(small_model, attention)
    dev = model.embed.weight.device
    prefix = {b"a": seq(6, 10), b"b": seq(13, 11), b"c": seq(2, 12)}
    new = [seq(3, 13), seq(3, 14), seq(3, 15)]  # every session brings M + 1 = 3 rows
    outs, caches = [], []
    for batch, width in ((None, None), (4, 8)):
        cache = _cache(model)
        for s, toks in prefix.items():  # a cached prefix, written by the exact path
            host, w = BatchLayout.pack(cache, [s], [toks])
            flat, lay = BatchLayout.paged(host.to(dev), [s], len(toks), 1, w, attention)
            model.forward(flat, cache, lay)
        sessions = list(prefix)
        host, w = BatchLayout.pack(cache, sessions, new, batch=batch, width=width)
        assert w == (width or 4)
        rows = (batch or 3) * 3
        flat, lay = BatchLayout.paged(host.to(dev), sessions, rows, batch or 3, w, attention)
        assert lay.table.shape == ((batch or 3), w) and int(lay.cu_q[-1]) == rows
        outs.append(model.logits(model.forward(flat, cache, lay))[:9].cpu())
        caches.append(cache)
    torch.testing.assert_close(outs[1], outs[0], atol=ATOL, rtol=0)
    for k0, k1 in zip(caches[0].k + caches[0].v, caches[1].k + caches[1].v, strict=True):
        # the padding sessions wrote nothing (block 0 holds a's keys); values differ only by the
        # rounding of matrix products over a different number of rows
        torch.testing.assert_close(k1, k0, atol=1e-5, rtol=0)
    for s, toks in zip(prefix, new, strict=True):
        ref = dense_logits(small_model, prefix[s] + toks)[len(prefix[s]):]
        i = list(prefix).index(s)
        torch.testing.assert_close(outs[0][3 * i : 3 * i + 3], ref, atol=ATOL, rtol=0)


def test_pack_rejects_a_batch_or_table_too_small(small_model) -> None:
    cache = _cache(small_model)
    with pytest.raises(ValueError):
        BatchLayout.pack(cache, [b"a", b"b"], [[1], [2]], batch=1)
    with pytest.raises(ValueError):
        BatchLayout.pack(cache, [b"c"], [seq(9, 1)], width=2)


def test_attention_and_graph_options(small_model) -> None:
    assert ModelRunner(small_model).attention == "sdpa"  # CPU default: unchanged
    assert ModelRunner(small_model).graphs is None
    with pytest.raises(ValueError, match="attention"):
        ModelRunner(small_model, attention="flash")
    with pytest.raises(ValueError, match="CUDA"):
        ModelRunner(small_model, attention="triton", cuda_graphs=True)
