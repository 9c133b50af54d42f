from __future__ import annotations

import hashlib
import struct

import pytest
import torch

from sdcp_fast.model.contract_digests import scorer_digest, tokenizer_digest, weights_digest
from sdcp_fast.model.target_scorer import ModelRunner
from sdcp_fast.protocol.problems import BadContract
from sdcp_fast.protocol.session import VerifierSession

from .conftest import SMALL, random_model


def test_weights_digest_follows_the_documented_byte_order() -> None:
    from sdcp_fast.model.config import ModelConfig
    from sdcp_fast.model.llama import Transformer

    cfg = ModelConfig(vocab_size=3, dim=2, n_layers=0, n_heads=1, n_kv_heads=1, ffn_dim=2)
    m = Transformer(cfg)
    with torch.no_grad():
        m.embed.weight.copy_(torch.arange(6.0).view(3, 2))
        m.norm.weight.copy_(torch.tensor([1.0, -2.0]))
    h = hashlib.sha256(b"SDCP-WEIGHTS-1\x00")
    for name, t in [("model.embed_tokens.weight", m.embed.weight), ("model.norm.weight", m.norm.weight)]:
        raw = b"".join(struct.pack("<f", float(x)) for x in t.detach().flatten())
        h.update(name.encode() + b"\x00F32\x00" + struct.pack(">I", t.dim()) +
                 b"".join(struct.pack(">I", d) for d in t.shape) + struct.pack(">Q", len(raw)) + raw)
    assert weights_digest(m) == h.digest()


def test_weights_digest_sees_every_value() -> None:
    a, b = random_model(SMALL, 0), random_model(SMALL, 0)
    assert weights_digest(a) == weights_digest(b)
    with torch.no_grad():
        b.layers[2].ffn.w_down.weight[0, 0] += 1e-6
    assert weights_digest(a) != weights_digest(b)


def test_tokenizer_digest() -> None:
    from tokenizers import Tokenizer, models

    t1 = Tokenizer(models.BPE(vocab={"a": 0, "b": 1, "ab": 2}, merges=[("a", "b")]))
    t2 = Tokenizer(models.BPE(vocab={"a": 0, "b": 1, "ab": 3}, merges=[("a", "b")]))
    assert tokenizer_digest(t1) == tokenizer_digest(Tokenizer.from_str(t1.to_str()))
    assert tokenizer_digest(t1) != tokenizer_digest(t2)


def test_a_contract_naming_another_model_of_the_same_shape_is_refused() -> None:
    """§6.1 with two random models of one shape: the verifier's session-open check compares
    the contract's target with the weights digest of the model it serves."""
    from tests.roles.rolekit import contract, session_open, sid

    ours, other = ModelRunner(random_model(SMALL, 0)), ModelRunner(random_model(SMALL, 1))
    assert scorer_digest(ours) == weights_digest(ours.model) != scorer_digest(other)
    prompt = [1, 2, 3]
    VerifierSession.open(session_open(sid(1), contract(target=scorer_digest(ours)), prompt=prompt),
                         target_digest=scorer_digest(ours))
    with pytest.raises(BadContract) as err:
        VerifierSession.open(session_open(sid(1), contract(target=scorer_digest(other)), prompt=prompt),
                             target_digest=scorer_digest(ours))
    assert err.value.suffix == "sdcp-bad-contract"


def test_drafter_digest_names_the_weights_of_a_model_of_its_own() -> None:
    from sdcp_fast.model.contract_digests import drafter_digest, model_digest
    from sdcp_fast.model.drafters import ModelDrafter, NgramDrafter

    target, draft = ModelRunner(random_model(SMALL, 0)), random_model(SMALL, 1)
    assert drafter_digest(ModelDrafter(draft), target) == weights_digest(draft)
    assert drafter_digest(ModelDrafter(target.model, n_layers=1), target) == model_digest("layerskip:1")
    assert drafter_digest(NgramDrafter(SMALL.vocab_size), target) == model_digest("ngram")
