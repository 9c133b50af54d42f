"""Every block format the GGUF loader reads: a file written by the ``gguf`` package's writer
with all matrices in that format loads to the values of ``gguf``'s reference dequantization
(``gguf.quants.dequantize``), each tensor in its place (shape reversed, llama.cpp's q/k row
order undone); the formats ``gguf`` can also quantize come back within their rounding error."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from tokenizers import pre_tokenizers

from sdcp_fast.model import loader
from sdcp_fast.model.weights import unpermute_rope

DIM, FFN, HEADS, KV = 256, 256, 4, 2  # K-quant blocks are 256 wide
# Offsets of the float16 scales in each K-quant block (the rest of a block is any bytes).
K_SCALES = {Q.Q2_K: (80, 82), Q.Q3_K: (108,), Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208,)}
ROUNDABLE = {Q.Q4_0: 0.2, Q.Q4_1: 0.2, Q.Q5_0: 0.1, Q.Q5_1: 0.1, Q.Q8_0: 0.01, Q.BF16: 0.01, Q.F16: 1e-3}
FORMATS = [Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.F16, Q.BF16, Q.F32]


def _blocks(rng: np.random.Generator, rows: int, cols: int, qtype: Q) -> tuple[np.ndarray, np.ndarray | None]:
    """(what the file holds, the floats it was rounded from or None for made-up K-quant blocks)."""
    if qtype in K_SCALES:
        block, size = gguf.GGML_QUANT_SIZES[qtype]
        raw = rng.integers(0, 256, (rows, cols // block * size), dtype=np.uint8)
        view = raw.reshape(rows, cols // block, size)
        for off in K_SCALES[qtype]:
            view[..., off:off + 2] = rng.uniform(0.001, 0.01, view.shape[:2]).astype(np.float16)[..., None].view(np.uint8)
        return raw, None
    x = rng.standard_normal((rows, cols)).astype(np.float32)
    return (x if qtype == Q.F32 else gguf.quants.quantize(x, qtype)), x


def _write(path: Path, qtype: Q) -> dict[str, tuple[np.ndarray, np.ndarray | None]]:
    rng = np.random.default_rng(int(qtype))
    tokens = [*sorted(pre_tokenizers.ByteLevel.alphabet()), "he"]
    w = gguf.GGUFWriter(str(path), "llama")
    for add, v in ((w.add_block_count, 1), (w.add_context_length, 64), (w.add_embedding_length, DIM),
                   (w.add_feed_forward_length, FFN), (w.add_head_count, HEADS), (w.add_head_count_kv, KV)):
        add(v)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_token_types([1] * len(tokens))
    w.add_token_merges(["h e"])
    w.add_eos_token_id(0)
    hd = DIM // HEADS
    shapes = {"token_embd.weight": (len(tokens), DIM), "output.weight": (len(tokens), DIM),
              "blk.0.attn_q.weight": (HEADS * hd, DIM), "blk.0.attn_k.weight": (KV * hd, DIM),
              "blk.0.attn_v.weight": (KV * hd, DIM), "blk.0.attn_output.weight": (DIM, HEADS * hd),
              "blk.0.ffn_gate.weight": (FFN, DIM), "blk.0.ffn_up.weight": (FFN, DIM), "blk.0.ffn_down.weight": (DIM, FFN)}
    written = {}
    for name, (rows, cols) in shapes.items():
        data, orig = _blocks(rng, rows, cols, qtype)
        w.add_tensor(name, data, raw_dtype=None if qtype == Q.F32 else qtype)
        written[name] = (data, orig)
    for name in ("output_norm.weight", "blk.0.attn_norm.weight", "blk.0.ffn_norm.weight"):
        w.add_tensor(name, rng.uniform(0.5, 1.5, DIM).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return written


OURS = {"token_embd.weight": "embed.weight", "output.weight": "lm_head.weight",
        "blk.0.attn_q.weight": "layers.0.attn.wq.weight", "blk.0.attn_k.weight": "layers.0.attn.wk.weight",
        "blk.0.attn_v.weight": "layers.0.attn.wv.weight", "blk.0.attn_output.weight": "layers.0.attn.wo.weight",
        "blk.0.ffn_gate.weight": "layers.0.ffn.w_gate.weight", "blk.0.ffn_up.weight": "layers.0.ffn.w_up.weight",
        "blk.0.ffn_down.weight": "layers.0.ffn.w_down.weight"}


@pytest.mark.parametrize("qtype", FORMATS, ids=lambda q: q.name)
def test_loader_reads_each_block_format_as_gguf_dequantizes_it(tmp_path, qtype) -> None:
    path = tmp_path / f"{qtype.name}.gguf"
    written = _write(path, qtype)
    lm = loader.load_gguf(path, cache=False)
    assert lm.meta["quantization"] == sorted({qtype.name, "F32"})
    state = lm.model.state_dict()
    for name, (data, orig) in written.items():
        want = torch.from_numpy(np.asarray(gguf.quants.dequantize(data, qtype), dtype=np.float32).copy())
        if name.endswith("attn_q.weight"):
            want = unpermute_rope(want, HEADS)
        elif name.endswith("attn_k.weight"):
            want = unpermute_rope(want, KV)
        got = state[OURS[name]]
        assert got.shape == want.shape and torch.isfinite(got).all(), name
        assert torch.equal(got, want), name
        if orig is not None:  # and within the format's rounding of the original values
            ref = torch.from_numpy(orig)
            if name.endswith("attn_q.weight"):
                ref = unpermute_rope(ref, HEADS)
            elif name.endswith("attn_k.weight"):
                ref = unpermute_rope(ref, KV)
            assert (got - ref).abs().max() <= ROUNDABLE.get(qtype, 0.0) * ref.abs().max(), name


def test_q8_0_blocks_are_scale_times_int8() -> None:
    """An independent reading of one Q8_0 block: float16 scale d, then 32 int8 values q: d * q."""
    x = np.linspace(-1, 1, 32, dtype=np.float32)[None]
    raw = gguf.quants.quantize(x, Q.Q8_0)[0]
    d = raw[:2].view(np.float16).astype(np.float32)[0]
    q = raw[2:].view(np.int8).astype(np.float32)
    assert np.array_equal(gguf.quants.dequantize(raw[None], Q.Q8_0)[0], d * q)
