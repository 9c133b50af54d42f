"""GGUF files of the families llama.cpp defines (Llama, Qwen3, Phi-3, Gemma 2, Gemma 3;
Mistral's GGUFs are Llama's), written as llama.cpp's converter lays them out (names from
``gguf``'s own map, Llama's q/k rows permuted, Gemma's norms stored as 1 + w), give the
logits transformers gives for the same weights at every position (windows and soft-caps
included); an architecture the loader does not read is refused by name."""

from __future__ import annotations

import pytest
import torch

from sdcp_fast.model import loader
from sdcp_fast.model.config import UnsupportedModel
from sdcp_fast.model.contract_digests import weights_digest
from sdcp_fast.model.interfaces import ScoreRequest
from sdcp_fast.model.target_scorer import ModelRunner

from .families import GGUF_ARCH, hf_logits, make_checkpoint, require_transformers, write_gguf

PROMPT = torch.randint(0, 256, (40,), generator=torch.Generator().manual_seed(3)).tolist()


@pytest.mark.parametrize("family", ["llama", "llama3", "qwen3", "phi3", "gemma2", "gemma3"])
def test_gguf_logits_equal_transformers(family, tmp_path) -> None:
    require_transformers()
    # llama.cpp scales Gemma's queries by 1 / sqrt(head_dim) (27B models aside): no other scalar.
    hf = make_checkpoint(family, tmp_path / "hf", **({"query_pre_attn_scalar": 32} if "gemma" in family else {}))
    lm = loader.load_gguf(write_gguf(hf, family, tmp_path / f"{family}.gguf"), cache=False)
    assert lm.config.family == GGUF_ARCH[family].replace("gemma3", "gemma3_text")
    assert lm.config.fused_proj == (family == "phi3") and len(weights_digest(lm.model)) == 32
    got = ModelRunner(lm.model, attention="reference").score([ScoreRequest(b"s", PROMPT[:1], PROMPT[1:])])[0]
    torch.testing.assert_close(got, hf_logits(hf, PROMPT), atol=1e-4, rtol=1e-4)


def test_an_architecture_it_does_not_read_is_refused(tmp_path) -> None:
    import gguf
    import numpy as np

    path = tmp_path / "g.gguf"
    w = gguf.GGUFWriter(str(path), "falcon")
    w.add_tensor("token_embd.weight", np.zeros((4, 32), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(UnsupportedModel, match="GGUF architecture 'falcon' is not supported"):
        loader.load_gguf(path, cache=False)
