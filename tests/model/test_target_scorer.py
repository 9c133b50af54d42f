"""The target scorer (paged, batched passes) against the dense reference forward."""

from __future__ import annotations

import torch

from sdcp_fast.model.interfaces import ScoreRequest
from sdcp_fast.model.target_scorer import ModelRunner, greedy_token

from .reference import dense_logits

ATOL = 1e-4


def seq(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 97, (n,), generator=g).tolist()


def test_score_rows_match_dense_forward(small_model) -> None:
    r = ModelRunner(small_model, block_size=4, num_blocks=2)
    committed, proposal = seq(11, 1), seq(4, 2)
    out = r.score([ScoreRequest(b"a", committed, proposal)])[0]
    ref = dense_logits(small_model, committed + proposal)[len(committed) - 1:]
    assert out.shape == (5, 97) and out.dtype == torch.float32
    torch.testing.assert_close(out, ref, atol=ATOL, rtol=0)


def test_to_keeps_the_options_and_starts_an_empty_cache(small_model) -> None:
    r = ModelRunner(small_model, n_layers=1, block_size=4, num_blocks=3, attention="reference")
    committed = seq(9, 8)
    before = r.score([ScoreRequest(b"a", committed, [])])[0]
    assert r.cache.seqs
    assert r.to("cpu") is r
    assert not r.cache.seqs and r.passes == 0
    assert (r.n_layers, r.cache.block_size, r.attention, r.device.type) == (1, 4, "reference", "cpu")
    torch.testing.assert_close(r.score([ScoreRequest(b"a", committed, [])])[0], before, atol=0, rtol=0)


def test_ragged_batch_equals_each_session_alone(small_model) -> None:
    r = ModelRunner(small_model, block_size=4)
    reqs = [ScoreRequest(b"a", seq(3, 3), seq(4, 4)), ScoreRequest(b"b", seq(17, 5), []),
            ScoreRequest(b"c", seq(1, 6), seq(2, 7))]
    out = r.score(reqs)
    for q, o in zip(reqs, out, strict=True):
        ref = dense_logits(small_model, [*q.committed, *q.proposal])[len(q.committed) - 1:]
        torch.testing.assert_close(o, ref, atol=ATOL, rtol=0)


def test_reconcile_across_rounds_reuses_prefix_and_stays_exact(small_model) -> None:
    r = ModelRunner(small_model, block_size=4)
    committed = seq(9, 8)
    proposal = seq(6, 9)
    r.score([ScoreRequest(b"a", committed, proposal)])
    # Two proposal tokens accepted, then a different token: the cache keeps 11 positions.
    committed2 = committed + proposal[:2] + [(proposal[2] + 1) % 97]
    blocks_before = list(r.cache.seqs[b"a"].blocks)
    out = r.score([ScoreRequest(b"a", committed2, seq(3, 10))])[0]
    assert r.cache.seqs[b"a"].blocks[:3] == blocks_before[:3]  # the prefix was not moved
    ref = dense_logits(small_model, committed2 + seq(3, 10))[len(committed2) - 1:]
    torch.testing.assert_close(out, ref, atol=ATOL, rtol=0)
    # A committed list that forks early (fail-over, retry) is recomputed from the fork.
    forked = committed[:2] + seq(5, 11)
    out = r.score([ScoreRequest(b"a", forked, [])])[0]
    torch.testing.assert_close(out, dense_logits(small_model, forked)[-1:], atol=ATOL, rtol=0)
    assert r.cache.used_blocks() == 2  # 7 positions in blocks of 4; the rest went back


def test_prefill_decode_one_and_layer_skip(small_model) -> None:
    r = ModelRunner(small_model, block_size=4)
    prompt = seq(6, 12)
    torch.testing.assert_close(r.prefill(b"a", prompt), dense_logits(small_model, prompt)[-1], atol=ATOL, rtol=0)
    out = r.decode_one([(b"a", prompt + [3]), (b"b", [4, 5])])
    assert out.shape == (2, 97)
    torch.testing.assert_close(out[1], dense_logits(small_model, [4, 5])[-1], atol=ATOL, rtol=0)
    skip = ModelRunner(small_model, n_layers=1)
    assert len(skip.cache.k) == 1
    torch.testing.assert_close(skip.prefill(b"a", prompt), dense_logits(small_model, prompt, n_layers=1)[-1],
                               atol=ATOL, rtol=0)
    r.release(b"a")
    r.release(b"b")
    assert r.cache.used_blocks() == 0


def test_greedy_token_breaks_ties_to_smallest_id() -> None:
    assert greedy_token(torch.tensor([0.0, 2.0, 1.0, 2.0])) == 1


def test_dense_training_path_matches_reference(small_model) -> None:
    a, b = seq(7, 13), seq(7, 14)
    hidden = small_model.forward_dense(torch.tensor([a, b]))  # [2, 7, dim]
    torch.testing.assert_close(small_model.logits(hidden[1]), dense_logits(small_model, b), atol=ATOL, rtol=0)


def _kv(r: ModelRunner, session: bytes, n: int) -> list[torch.Tensor]:
    """The session's first ``n`` cached positions, K and V of every layer."""
    table = r.cache.block_table([session])
    lens = torch.tensor([n], dtype=torch.int32)
    return [t for layer in range(r.n_layers) for t in r.cache.gather(layer, table, lens)]


def test_a_prompt_fed_in_chunks_equals_one_pass(small_model) -> None:
    """Prefill chunks (requests with no proposal and a longer prefix of the prompt each time,
    as the verifier's batcher sends them beside other sessions' rounds) leave the same KV
    pages and give the same logits as the prompt in one pass; odd chunks, a prompt that is not
    a multiple of them, both attention paths."""
    prompt, proposal, other = seq(61, 15), seq(3, 16), seq(9, 17)
    for attention in ("sdpa", "reference"):
        one = ModelRunner(small_model, block_size=4, attention=attention)
        want = one.score([ScoreRequest(b"a", prompt, proposal)])[0]
        for chunk in (5, 13, 60):
            r = ModelRunner(small_model, block_size=4, attention=attention)
            for end in range(chunk, len(prompt), chunk):
                r.score([ScoreRequest(b"a", prompt[:end], []), ScoreRequest(b"b", other, [])])
                assert len(r.cache.seq(b"a").tokens) == end  # only the new positions were computed
            got = r.score([ScoreRequest(b"a", prompt, proposal)])[0]
            torch.testing.assert_close(got, want, atol=ATOL, rtol=0)
            for a, b in zip(_kv(r, b"a", len(prompt) + 3), _kv(one, b"a", len(prompt) + 3), strict=True):
                torch.testing.assert_close(a, b, atol=ATOL, rtol=1e-4)
