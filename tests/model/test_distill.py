"""``distill``: data stages, the reduced head, training side by side, the saved drafts."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from sdcp_fast import data
from sdcp_fast.model import contract_digests, loader
from sdcp_fast.model.config import ModelConfig
from sdcp_fast.model.distill import choose_head_ids, distill, init_draft
from sdcp_fast.model.distill_data import DistillConfig
from sdcp_fast.model.drafters import ModelDrafter
from sdcp_fast.model.loader import LoadedModel
from sdcp_fast.model.tokenizer import chat_prompt, encode

from .conftest import random_model

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA"))]


@pytest.fixture(scope="module")
def tiny_target() -> LoadedModel:
    """A random 3-layer model with a 300-token BPE trained on the built-in prompts."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok.train_from_iterator([p["text"] for p in data.prompts("train")],
                            trainers.BpeTrainer(vocab_size=300, special_tokens=specials,
                                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    cfg = ModelConfig(vocab_size=tok.get_vocab_size(), dim=48, n_layers=3, n_heads=6, n_kv_heads=2, ffn_dim=80,
                      eos_token_ids=(tok.token_to_id("<|im_end|>"),))
    return LoadedModel(random_model(cfg), tok, "tiny-random")


SMALL = DistillConfig(layers=(1, 2), head_vocab=64, prompts=6, self_prompts=4, copy_prompts=2, gen_tokens=12,
                      gen_batch=4, samples=0, top_k=8, steps=6, batch_tokens=256, warmup=2, minutes=5)


@pytest.mark.parametrize("device", DEVICES)
def test_distill_end_to_end(tiny_target, tmp_path, device) -> None:
    m = distill(tiny_target, tmp_path, SMALL, device)
    assert m["steps"] == SMALL.steps and set(m["drafts"]) == {"L1", "L2"}
    assert m["sequences"] >= SMALL.prompts  # the built-in prompts, then self-written and copy ones
    assert 0 < m["head_coverage"] <= 1 and m["answer_tokens"] > 0
    for n in (1, 2):
        d = loader.load(tmp_path / f"draft-L{n}", borrow=tiny_target.model.cpu())
        assert d.config.n_layers == n and d.config.head_vocab == 64 and len(d.model.head_ids) == 64
        logits = d.model.logits(torch.zeros(2, 48))
        outside = torch.ones(tiny_target.config.vocab_size, dtype=torch.bool)
        outside[d.model.head_ids] = False
        assert torch.isinf(logits[:, outside]).all() and torch.isfinite(logits[:, ~outside]).all()
        assert json.loads((tmp_path / f"draft-L{n}" / "config.json").read_text())["sdcp_fast"]["borrow_embedding"]
    saved = torch.load(tmp_path / "data.pt", weights_only=True)
    assert len(saved["self_prompts"]) <= SMALL.self_prompts and saved["done"] == len(saved["seqs"])
    for s, p, ids in zip(saved["seqs"], saved["prompt_lens"], saved["top_ids"], strict=True):
        assert ids.shape == (len(s) - p, SMALL.top_k) and ids[:, 0].tolist() == s[p:]  # greedy: top-1 is the token


def test_distill_resumes_and_continues_training(tiny_target, tmp_path) -> None:
    distill(tiny_target, tmp_path, replace(SMALL, layers=(1,), steps=3), "cpu")
    before = torch.load(tmp_path / "data.pt", weights_only=True)["seqs"]
    m = distill(tiny_target, tmp_path, replace(SMALL, layers=(1,), steps=5), "cpu")
    assert m["steps"] == 5  # continued from the checkpoint's 3
    assert torch.load(tmp_path / "data.pt", weights_only=True)["seqs"] == before  # data not remade


def test_reduced_head_drafter_proposes_inside_its_ids(tiny_target) -> None:
    target = tiny_target.model.cpu()
    ids = torch.arange(0, target.cfg.vocab_size, 3)
    draft = init_draft(target, 2, ids).eval().requires_grad_(False)
    drafter = ModelDrafter(draft)
    prompt = encode(tiny_target.tokenizer, chat_prompt("Explain the moon."))
    greedy = drafter.propose(b"a", prompt, 4, rule=1)
    sampled = drafter.propose(b"b", prompt, 4, rule=2, temperature_milli=900, top_p_milli=900,
                              generator=torch.Generator().manual_seed(3))
    allowed = set(ids.tolist())
    assert set(greedy.tokens) <= allowed and set(sampled.tokens) <= allowed
    assert sampled.q_rows is not None
    outside = torch.ones(target.cfg.vocab_size, dtype=torch.bool)
    outside[ids] = False
    assert (sampled.q_rows[:, outside] == 0).all()
    torch.testing.assert_close(sampled.q_rows.sum(-1), torch.ones(4))


def test_head_ids_round_trip_and_count_in_the_identity(tiny_target, tmp_path) -> None:
    target = tiny_target.model.cpu()
    a = init_draft(target, 1, torch.tensor([0, 2, 5, 7])).eval()
    b = init_draft(target, 1, torch.tensor([0, 2, 5, 8])).eval()
    b.load_state_dict({k: v for k, v in a.state_dict().items() if k != "head_ids"}, strict=False)
    assert contract_digests.weights_digest(a) != contract_digests.weights_digest(b)
    loader.save_hf_dir(a, tmp_path / "d", borrow_embedding=True, dtype=torch.float32)
    back = loader.load(tmp_path / "d", borrow=target).model
    assert back.head_ids.tolist() == [0, 2, 5, 7] and back.head_ids.dtype == torch.int64
    assert contract_digests.weights_digest(back) == contract_digests.weights_digest(a)


def test_choose_head_ids_counts_answers_only() -> None:
    seqs = [[9, 9, 9, 1, 1, 2], [9, 3, 3, 3]]
    assert choose_head_ids(seqs, [3, 1], 3, (7,), 20).tolist() == [1, 3, 7]  # 7, then 3 (x3), 1 (x2)
    assert choose_head_ids(seqs, [3, 1], 6, (7,), 20).tolist() == [0, 1, 2, 3, 7, 9]  # 2, prompts' 9, then 0


def test_extra_data_joins_the_training_set_without_duplicates(tiny_target, tmp_path) -> None:
    a = distill(tiny_target, tmp_path / "a", replace(SMALL, layers=(1,), steps=1), "cpu")
    b = distill(tiny_target, tmp_path / "b", replace(SMALL, layers=(1,), steps=1, seed=1), "cpu")
    both = distill(tiny_target, tmp_path / "c", replace(SMALL, layers=(1,), steps=1, prompts=0, self_prompts=0,
                                                        copy_prompts=0, extra_data=(str(tmp_path / "a" / "data.pt"),
                                                                                    str(tmp_path / "b" / "data.pt"))),
                   "cpu")
    # The built-in prompts' greedy answers are the same in both runs: counted once.
    assert max(a["sequences"], b["sequences"]) < both["sequences"] < a["sequences"] + b["sequences"]
    with pytest.raises(FileNotFoundError):
        distill(tiny_target, tmp_path / "d", replace(SMALL, extra_data=(str(tmp_path / "none.pt"),)), "cpu")
