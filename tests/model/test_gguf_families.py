"""GGUF files of the families llama.cpp defines and the loader reads (Llama, Qwen3, Phi-3;
Mistral's GGUFs are Llama's), written as llama.cpp's converter lays them out, give the
logits transformers gives for the same weights at every position (Phi-3's window included);
a family it does not read is refused by name."""

from __future__ import annotations

import pytest
import torch

from sdcp_fast.model import loader
from sdcp_fast.model.config import UnsupportedModel
from sdcp_fast.model.interfaces import ScoreRequest
from sdcp_fast.model.target_scorer import ModelRunner

from .families import GGUF_ARCH, hf_logits, make_checkpoint, require_transformers, write_gguf

PROMPT = torch.randint(0, 256, (40,), generator=torch.Generator().manual_seed(3)).tolist()


@pytest.mark.parametrize("family", ["llama", "llama3", "qwen3", "phi3"])
def test_gguf_logits_equal_transformers(family, tmp_path) -> None:
    require_transformers()
    hf = make_checkpoint(family, tmp_path / "hf")
    lm = loader.load_gguf(write_gguf(hf, family, tmp_path / f"{family}.gguf"), cache=False)
    assert lm.config.family == GGUF_ARCH[family]
    assert lm.config.fused_proj == (family == "phi3")
    got = ModelRunner(lm.model, attention="reference").score([ScoreRequest(b"s", PROMPT[:1], PROMPT[1:])])[0]
    torch.testing.assert_close(got, hf_logits(hf, PROMPT), atol=1e-4, rtol=1e-4)


def test_an_architecture_it_does_not_read_is_refused(tmp_path) -> None:
    import gguf
    import numpy as np

    path = tmp_path / "g.gguf"
    w = gguf.GGUFWriter(str(path), "gemma2")
    w.add_tensor("token_embd.weight", np.zeros((4, 32), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(UnsupportedModel, match="GGUF architecture 'gemma2' is not supported"):
        loader.load_gguf(path, cache=False)
