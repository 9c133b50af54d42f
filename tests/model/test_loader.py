from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from sdcp_fast.model import loader
from sdcp_fast.model.bulk import generate_rows
from sdcp_fast.model.contract_digests import weights_digest
from sdcp_fast.model.distill import _head_pos, _tensors, init_draft, loss_fn
from sdcp_fast.model.distill_data import TeacherData
from sdcp_fast.model.weights import unpermute_rope

from .conftest import SMALL, random_model


def test_hf_directory_roundtrip_is_exact_in_float32(tmp_path) -> None:
    m = random_model()
    loader.save_hf_dir(m, tmp_path, dtype=torch.float32)
    hf = json.loads((tmp_path / "config.json").read_text())
    assert hf["model_type"] == "llama" and hf["num_key_value_heads"] == SMALL.n_kv_heads
    back = loader.load(tmp_path)
    assert back.config == m.cfg
    assert weights_digest(back.model) == weights_digest(m)


def test_unpermute_inverts_llama_cpp_permutation() -> None:
    w = torch.arange(2 * 8 * 3).float().view(16, 3)  # 2 heads of head_dim 8
    # llama.cpp's convert script: reshape(n_head, 2, hd/2, ...).swapaxes(1, 2)
    permuted = w.reshape(2, 2, 4, 3).swapaxes(1, 2).reshape(16, 3)
    assert torch.equal(unpermute_rope(permuted, 2), w)


def test_distilled_draft_borrows_embedding_and_head(tmp_path) -> None:
    target = random_model()
    draft = init_draft(target, 1)
    loader.save_hf_dir(draft, tmp_path, borrow_embedding=True)
    with pytest.raises(ValueError, match="borrows"):
        loader.load(tmp_path)
    back = loader.load(tmp_path, borrow=target)
    assert back.model.embed.weight.data_ptr() == target.embed.weight.data_ptr()
    assert back.config.n_layers == 1


def test_distill_loss_is_zero_for_a_copy_of_the_target() -> None:
    """Labels made by bulk generation from the target itself: a whole copy of the target
    scores KL 0 and full agreement, a one-layer cut does not."""
    target = random_model()
    d = TeacherData(Path("unused"))
    for p, r in zip([[1, 2, 3], [6]], generate_rows(target, [[1, 2, 3], [6]], 4, top_k=97), strict=True):
        d.seqs.append(p + r.tokens)
        d.prompt_lens.append(len(p))
        d.top_ids.append(r.top_ids)
        d.top_logits.append(r.top_logits)
    emitted = sorted({t for s, p in zip(d.seqs, d.prompt_lens, strict=True) for t in s[p:]} | {0, 30})
    for ids in (None, torch.tensor(emitted)):  # the whole head, and one that holds every emitted id
        batch = _tensors(d, [0, 1], _head_pos(97, ids), torch.device("cpu"))
        loss, top1 = loss_fn(init_draft(target, SMALL.n_layers, ids), batch)
        assert float(loss.detach()) < 1e-3 and top1 == 1.0  # float16 labels
        loss1, _ = loss_fn(init_draft(target, 1, ids), batch)
        assert float(loss1.detach()) > 1e-2
