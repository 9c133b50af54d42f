from __future__ import annotations

import torch

from sdcp_fast.model.drafters import ModelDrafter, NgramDrafter
from sdcp_fast.model.target_scorer import greedy_token

from .reference import dense_logits


def test_ngram_proposes_what_followed_the_latest_match() -> None:
    d = NgramDrafter(50, n_min=1, n_max=3)
    c = [1, 2, 3, 4, 9, 1, 2, 3, 5, 6, 7, 8, 2, 3]
    draft = d.propose(b"s", c, 3, rule=1)
    assert draft.tokens == [5, 6, 7]  # "2 3" last occurred before 5 (the 3-gram "8 2 3" never did)
    assert draft.q_rows is None
    c += [5, 6]
    assert d.propose(b"s", c, 4, rule=2).tokens == [7, 8, 2, 3]
    q = d.propose(b"s", c, 2, rule=2).q_rows
    assert q is not None and q.shape == (2, 50) and torch.equal(q.sum(1), torch.ones(2))
    assert q[0, 7] == 1 and q[1, 8] == 1


def test_ngram_falls_back_and_resyncs_after_a_fork() -> None:
    d = NgramDrafter(50, n_max=2)
    assert d.propose(b"s", [1, 2, 3], 4, rule=1).tokens == [3]  # no match: one guess
    assert d.propose(b"s", [1, 2, 3, 1], 4, rule=1).tokens == [2, 3, 1]
    # The committed list changed under the index (a retry on another prefix).
    assert d.propose(b"s", [7, 8, 7], 2, rule=1).tokens == [8, 7]
    d.release(b"s")


def test_model_drafter_rule1_is_greedy_of_its_model(small_model) -> None:
    d = ModelDrafter(small_model, block_size=4)
    c = [5, 6, 7]
    draft = d.propose(b"s", c, 3, rule=1)
    ctx = list(c)
    for tok in draft.tokens:
        assert tok == greedy_token(dense_logits(small_model, ctx)[-1])
        ctx.append(tok)
    skip = ModelDrafter(small_model, n_layers=2)
    assert skip.name == "layerskip:2"
    assert skip.propose(b"s", c, 1, rule=1).tokens == [greedy_token(dense_logits(small_model, c, n_layers=2)[-1])]


def test_model_drafter_rule2_samples_from_the_rows_it_returns(small_model) -> None:
    d = ModelDrafter(small_model, block_size=4)
    g = torch.Generator().manual_seed(3)
    draft = d.propose(b"s", [1, 2], 4, rule=2, temperature_milli=700, top_k=10, generator=g)
    q = draft.q_rows
    assert q is not None and q.shape == (4, 97) and q.dtype == torch.float32
    torch.testing.assert_close(q.sum(1), torch.ones(4))
    assert all(q[i, t] > 0 for i, t in enumerate(draft.tokens))
    assert all(int((row > 0).sum()) <= 10 for row in q)  # top-k applied to its own logits
    # Same seed, same draft: the drafter's randomness is its generator alone.
    again = ModelDrafter(small_model).propose(b"s", [1, 2], 4, rule=2, temperature_milli=700, top_k=10,
                                              generator=torch.Generator().manual_seed(3))
    assert again.tokens == draft.tokens
