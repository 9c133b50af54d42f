"""Target KV pages: export from one runner's paged cache, import into another's, and the
imported prefix is not computed again; pages of another model, shape or token list refused."""

from __future__ import annotations

import hashlib

import pytest
import torch

from sdcp_fast.model.interfaces import ScoreRequest
from sdcp_fast.model.kv_cache import PagedKVCache
from sdcp_fast.model.kv_transfer import (
    HEADER_BYTES,
    Layout,
    PagedTargetKV,
    PagesRefused,
    decode,
    encode,
    install,
    snapshot,
    target_kv_of,
)
from sdcp_fast.model.target_scorer import ModelRunner

from .reference import dense_logits

MODEL = hashlib.sha256(b"tests/model/kv_transfer").digest()
OTHER = hashlib.sha256(b"another model").digest()
ATOL = 1e-4


def seq(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 97, (n,), generator=g).tolist()


class Counting(ModelRunner):
    """A runner that records how many positions each pass computed (its reconcile, asked first,
    answers what the pass itself will keep)."""

    computed: list[int]

    def score(self, batch):  # type: ignore[no-untyped-def]
        self.computed = getattr(self, "computed", [])
        for r in batch:
            kept = self.cache.reconcile(r.session, r.committed, keep_last=1)
            self.computed.append(len(r.committed) - kept + len(r.proposal))
        return super().score(batch)


@pytest.mark.parametrize(("n", "block_a", "block_b"), [(1, 4, 4), (7, 4, 3), (13, 5, 16), (16, 4, 4)])
def test_round_trip_across_block_sizes_then_only_the_rest_is_computed(small_model, n, block_a, block_b) -> None:
    a = ModelRunner(small_model, block_size=block_a, num_blocks=2)
    committed = seq(n, n)
    proposal = seq(3, 100 + n)
    a.score([ScoreRequest(b"a", committed, proposal)])
    # Rejected proposal positions are not committed state: the committed list takes 1 of 3.
    later = [*committed, proposal[0], (proposal[1] + 1) % 97]
    pages = snapshot(a.cache, b"a", later, MODEL)
    assert pages is not None and pages.tokens == tuple(later[: n + 1])
    raw = encode(pages)
    assert len(raw) == HEADER_BYTES + 4 * (n + 1) + Layout.of(a.cache, MODEL).payload_bytes(n + 1)

    b = Counting(small_model, block_size=block_b, num_blocks=1)
    b.score([ScoreRequest(b"other", seq(5, 3), [])])  # the pool is not empty: blocks are not 0..k
    kv = target_kv_of(b, MODEL)
    assert isinstance(kv, PagedTargetKV)
    assert kv.import_kv(b"s", kv.decode_kv(memoryview(raw)), later) == n + 1
    b.computed.clear()
    nxt = seq(2, 7)
    out = b.score([ScoreRequest(b"s", later, nxt)])[0]
    # The last committed position is always computed (its logits are needed), nothing before it.
    assert b.computed == [1 + len(nxt)]
    torch.testing.assert_close(out, dense_logits(small_model, later + nxt)[len(later) - 1:], atol=ATOL, rtol=0)


def test_pages_keep_the_values_bit_for_bit(small_model) -> None:
    a = ModelRunner(small_model, block_size=4)
    committed = seq(9, 1)
    a.score([ScoreRequest(b"a", committed, [])])
    pages = snapshot(a.cache, b"a", committed, MODEL)
    back = decode(encode(pages), Layout.of(a.cache, MODEL))
    assert back.tokens == pages.tokens and back.block_size == 4
    for x, y in zip([*pages.k, *pages.v], [*back.k, *back.v], strict=True):
        assert torch.equal(x, y)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_caches_round_trip(dtype) -> None:
    c = PagedKVCache(2, 3, 5, block_size=4, num_blocks=2, dtype=dtype)
    slots = torch.tensor(c.append_slots(b"a", [1, 2, 3, 4, 5, 6]), dtype=torch.int64)
    for layer in range(2):
        c.write(layer, torch.randn(6, 3, 5).to(dtype), torch.randn(6, 3, 5).to(dtype), slots)
    pages = snapshot(c, b"a", [1, 2, 3, 4, 5, 6, 7], MODEL)
    assert pages is not None and len(pages) == 6
    d = PagedKVCache(2, 3, 5, block_size=3, num_blocks=1, dtype=dtype)
    assert install(d, b"b", decode(encode(pages), Layout.of(d, MODEL)), [1, 2, 3, 4, 5, 6, 7]) == 6
    lens = torch.tensor([6], dtype=torch.int32)
    for layer in range(2):
        assert torch.equal(d.gather(layer, d.block_table([b"b"]), lens)[0], c.gather(layer, c.block_table([b"a"]), lens)[0])


def small_pages() -> tuple[PagedKVCache, bytes]:
    c = PagedKVCache(2, 1, 4, block_size=4, num_blocks=2)
    slots = torch.tensor(c.append_slots(b"a", [5, 6, 7]), dtype=torch.int64)
    for layer in range(2):
        c.write(layer, torch.randn(3, 1, 4), torch.randn(3, 1, 4), slots)
    pages = snapshot(c, b"a", [5, 6, 7], MODEL)
    assert pages is not None
    return c, bytes(encode(pages))


def test_pages_of_another_model_or_shape_are_refused() -> None:
    c, raw = small_pages()
    with pytest.raises(PagesRefused, match="another model"):
        decode(raw, Layout.of(c, OTHER))
    for other in (PagedKVCache(3, 1, 4), PagedKVCache(2, 2, 4), PagedKVCache(2, 1, 8),
                  PagedKVCache(2, 1, 4, dtype=torch.float16)):
        with pytest.raises(PagesRefused, match="shape"):
            decode(raw, Layout.of(other, MODEL))


def test_truncated_or_foreign_bytes_are_refused() -> None:
    c, raw = small_pages()
    lay = Layout.of(c, MODEL)
    for bad in (raw[:10], raw[:-1], raw + b"\0", b"X" + raw[1:]):
        with pytest.raises(PagesRefused):
            decode(bad, lay)


def test_pages_whose_tokens_differ_from_the_committed_ones_are_refused() -> None:
    c, raw = small_pages()
    pages = decode(raw, Layout.of(c, MODEL))
    d = PagedKVCache(2, 1, 4, block_size=4)
    with pytest.raises(PagesRefused, match="position 1"):
        install(d, b"b", pages, [5, 9, 7, 8])
    assert b"b" not in d.seqs or not d.seqs[b"b"].tokens
    # Pages that run ahead of the committed list, or stop short of it, give what they share.
    assert install(d, b"b", pages, [5, 6]) == 2
    assert install(d, b"b", pages, [5, 6, 7, 8, 9]) == 3


def test_nothing_cached_exports_nothing() -> None:
    c = PagedKVCache(2, 1, 4)
    assert snapshot(c, b"none", [1, 2], MODEL) is None
    c.append_slots(b"a", [3])
    assert snapshot(c, b"a", [4], MODEL) is None


def test_a_scorer_without_a_paged_cache_has_no_pages() -> None:
    from sdcp_fast.model.toy import ToyTarget

    assert target_kv_of(ToyTarget(), MODEL) is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="a CUDA cache needs a GPU")
def test_a_gpu_cache_round_trips_through_host_bytes() -> None:
    c = PagedKVCache(2, 2, 8, block_size=4, num_blocks=2, device="cuda")
    slots = torch.tensor(c.append_slots(b"a", list(range(7))), dtype=torch.int64, device="cuda")
    for layer in range(2):
        c.write(layer, torch.randn(7, 2, 8, device="cuda"), torch.randn(7, 2, 8, device="cuda"), slots)
    raw = encode(snapshot(c, b"a", list(range(7)), MODEL))
    d = PagedKVCache(2, 2, 8, block_size=16, num_blocks=1, device="cuda")
    assert install(d, b"b", decode(bytearray(raw), Layout.of(d, MODEL), device="cuda"), list(range(7))) == 7
    lens = torch.tensor([7], dtype=torch.int32, device="cuda")
    for layer in range(2):
        for got, want in zip(d.gather(layer, d.block_table([b"b"]), lens), c.gather(layer, c.block_table([b"a"]), lens),
                             strict=True):
            assert torch.equal(got, want)
