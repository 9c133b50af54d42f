"""``generate``: the command-line decoding path, on the roles with real (small) models."""

from __future__ import annotations

from sdcp_fast.deploy.local import generate
from sdcp_fast.model.drafters import ModelDrafter, NgramDrafter
from sdcp_fast.model.target_scorer import ModelRunner
from sdcp_fast.protocol import Sampling
from tests.model.conftest import SMALL, random_model

PROMPTS = [[1, 2, 3, 4, 1, 2], [5], [7, 7, 8, 9, 10, 11, 12, 13, 7, 8]]


def test_rule1_output_equals_greedy_with_every_drafter(small_model) -> None:
    target = ModelRunner(small_model, block_size=4)
    greedy = generate(target, None, PROMPTS, 12)
    assert all(r.rounds == 12 and r.self_decoded == 12 and r.chain_ok for r in greedy)
    other = random_model(SMALL, seed=5)  # a poor draft: many rejections and truncations
    for drafter in (NgramDrafter(97), ModelDrafter(other, block_size=4), ModelDrafter(small_model, n_layers=2)):
        for m in (1, 4):
            spec = generate(target, drafter, PROMPTS, 12, m=m)
            assert [r.tokens for r in spec] == [r.tokens for r in greedy], (drafter.name, m)
    assert target.cache.used_blocks() == 0


def test_self_draft_is_fully_accepted(small_model) -> None:
    target = ModelRunner(small_model)
    res = generate(target, ModelDrafter(small_model), PROMPTS[:1], 11, m=4)[0]
    assert res.acceptance == 1.0 and res.rounds == 3 and len(res.tokens) == 11


def test_stop_tokens_and_max_new_bound_the_output(small_model) -> None:
    target = ModelRunner(small_model)
    greedy = generate(target, None, PROMPTS[:1], 10)[0].tokens
    stop = greedy[3]
    out = generate(target, NgramDrafter(97), PROMPTS[:1], 10, stop=[stop])[0].tokens
    assert out == greedy[: greedy.index(stop) + 1]


def test_rule2_is_reproducible_with_a_seed(small_model) -> None:
    target = ModelRunner(small_model)
    sp = Sampling(temperature_milli=800, top_k=20, seed=7)
    a = generate(target, ModelDrafter(random_model(SMALL, 5)), PROMPTS, 10, rule=2, sampling=sp, seed=7)
    b = generate(target, ModelDrafter(random_model(SMALL, 5)), PROMPTS, 10, rule=2, sampling=sp, seed=7)
    assert [r.tokens for r in a] == [r.tokens for r in b]
    assert all(len(r.tokens) == 10 and r.chain_ok for r in a)
    c = generate(target, NgramDrafter(97), PROMPTS, 10, rule=2, sampling=sp)  # one-hot q rows
    assert all(len(r.tokens) == 10 for r in c)
    # Target-only rule 2 (self-decoded rounds draw from p[1] with the verifier's randoms).
    d = generate(target, None, PROMPTS, 10, rule=2, sampling=sp, seed=7)
    assert [r.tokens for r in d] == [r.tokens for r in generate(target, None, PROMPTS, 10, rule=2, sampling=sp,
                                                                  seed=7)]


def test_a_target_digest_given_is_not_computed_again(small_model, monkeypatch) -> None:
    """The command line has the target's digest from the catalog: generate takes it instead
    of hashing every weight again, and the run is the same."""
    from sdcp_fast.deploy import local
    from sdcp_fast.model.contract_digests import scorer_digest

    target = ModelRunner(small_model, block_size=4)
    digest = scorer_digest(target)
    hashed = generate(target, None, PROMPTS[:1], 6)[0]

    def refuse(scorer: object) -> bytes:
        raise AssertionError("the weights were hashed again")

    monkeypatch.setattr(local, "scorer_digest", refuse)
    given = generate(target, None, PROMPTS[:1], 6, target_digest=digest)[0]
    assert (given.tokens, given.digest, given.chain_ok) == (hashed.tokens, hashed.digest, True)
