"""The shipped tiny target/draft pair (``scripts/make_tiny_pair.py``): loads offline, its
tokenizer round-trips English, speculative rule 1 with the tiny draft is exactly greedy, and
the draft is accepted often enough to matter. Nothing is retrained here."""

from __future__ import annotations

import pytest

from sdcp_fast.deploy.catalog import load_drafter, target_of
from sdcp_fast.deploy.local import generate
from sdcp_fast.model import loader
from sdcp_fast.model.config import CONFIGS
from sdcp_fast.model.target_scorer import ModelRunner
from sdcp_fast.model.tokenizer import decode, encode
from sdcp_fast.protocol import Sampling

# Dictionary-style English, written for these tests (not taken from the training text).
TEXTS = [
    "A small boat used for crossing a river; a ferry.",
    "To make known by speaking or writing; to declare; as, to announce the arrival of a guest.",
    "The act of walking slowly along a path in the evening.",
    "Of or pertaining to the sea; marine; as, the naval forces of a state.",
    "A tree of the genus Quercus, having hard wood and bearing acorns.",
]
MAX_NEW = 20

# Measured on the shipped pair: 0.42 acceptance (60 / 144, rule 1, M = 4; 2.5 tokens per
# target pass) on these five prompts x 20 tokens (0.40 on 12 held-out paragraphs when made);
# the floor is about half of it.
ACCEPTANCE_FLOOR = 0.2


@pytest.fixture(scope="module")
def tiny():
    return loader.load("tiny-target")


@pytest.fixture(scope="module")
def prompts(tiny) -> list[list[int]]:
    return [encode(tiny.tokenizer, t)[:12] for t in TEXTS]


@pytest.fixture(scope="module")
def greedy(tiny, prompts):
    return generate(ModelRunner(tiny.model), None, prompts, MAX_NEW)


def test_both_load_offline_from_the_package(tiny) -> None:
    draft = loader.load("tiny-draft")
    for name, lm in (("tiny-target", tiny), ("tiny-draft", draft)):
        assert loader.resolve(name) == loader.shipped_path(name)
        want, got = CONFIGS[name], lm.config
        assert (got.vocab_size, got.dim, got.n_layers, got.n_heads, got.n_kv_heads, got.ffn_dim) == \
            (want.vocab_size, want.dim, want.n_layers, want.n_heads, want.n_kv_heads, want.ffn_dim)
        assert got.eos_token_ids == (0,)
        assert lm.tokenizer is not None and lm.tokenizer.token_to_id("<|endoftext|>") == 0
    assert draft.tokenizer.to_str() == tiny.tokenizer.to_str()


def test_tokenizer_round_trips_english(tiny) -> None:
    tok = tiny.tokenizer
    assert tok.get_vocab_size() == 4096
    for text in [*TEXTS, "  Two spaces,\ttabs\nand new lines.\n", "Naïve café — 12,345 items (¼ off)!", ""]:
        assert decode(tok, encode(tok, text)) == text
    ids = encode(tok, " ".join(TEXTS))
    assert len(ids) < len(" ".join(TEXTS)) / 3  # it learnt English words, not bytes
    assert encode(tok, "end<|endoftext|>")[-1] == 0


def test_rule1_with_the_tiny_draft_is_greedy(tiny, prompts, greedy) -> None:
    target = ModelRunner(tiny.model)
    drafter = load_drafter("model:tiny-draft", target_of("tiny-target", tiny))[0]
    assert all(len(r.tokens) == MAX_NEW for r in greedy)
    for m in (1, 4):
        spec = generate(target, drafter, prompts, MAX_NEW, m=m)
        assert [r.tokens for r in spec] == [r.tokens for r in greedy], m
        accepted, proposed = sum(r.accepted for r in spec), sum(r.proposed for r in spec)
        assert 0 < accepted < proposed, (m, accepted, proposed)  # acceptances and rejections both happen
        if m == 4:
            assert accepted / proposed >= ACCEPTANCE_FLOOR, accepted / proposed
            assert sum(r.rounds for r in spec) < sum(r.rounds for r in greedy)
    assert target.cache.used_blocks() == 0


def test_rule2_runs(tiny, prompts) -> None:
    sp = Sampling(temperature_milli=700, top_k=50, seed=11)
    drafter = load_drafter("model:tiny-draft", target_of("tiny-target", tiny))[0]
    res = generate(ModelRunner(tiny.model), drafter, prompts[:3], 12, m=4,
                   rule=2, sampling=sp)
    assert all(len(r.tokens) == 12 for r in res)
    assert sum(r.accepted for r in res) > 0
