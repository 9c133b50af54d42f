"""Target KV pages as bytes: the KV of a session's first n cached positions, exported from a
:class:`~sdcp_fast.model.kv_cache.PagedKVCache` and imported into another one, so that a
verifier taking over a session (§6.9, ``resume.target_kv``) computes only what is missing.

Format (docs/mlc.md, "target_kv objects"); integers big-endian, like token objects::

    magic       8 bytes   b"SDCPKV1\\0"
    model      32 bytes   the target's digest (contract ``target``): pages of another model are refused
    n_layers, n_kv_heads, head_dim   uint16 each
    dtype       uint8     1 float32, 2 float16, 3 bfloat16
    reserved    uint8     0
    block_size  uint32    the writer's (informative: positions are copied one by one)
    n           uint32    positions
    tokens      n x uint32, the token of each position (prompt, then committed output)
    for each layer: K [n, n_kv_heads, head_dim], then V, row-major, values little-endian

The model knows no role: the verifier decides when to export and where the bytes go.
"""

from __future__ import annotations

import struct
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .kv_cache import PagedKVCache

MAGIC = b"SDCPKV1\x00"
_HEAD = struct.Struct(">8s32sHHHBBII")
HEADER_BYTES = _HEAD.size
_CODES = {torch.float32: 1, torch.float16: 2, torch.bfloat16: 3}
_DTYPES = {code: dtype for dtype, code in _CODES.items()}

if sys.byteorder != "little":  # pragma: no cover - the payload is torch's native order
    raise ImportError("kv_transfer writes values in the host's order, which must be little-endian")


class PagesRefused(ValueError):
    """The bytes are not target KV pages this cache can take (another model, another shape,
    other tokens, truncated): the caller computes the prefix instead."""


@dataclass(frozen=True)
class Layout:
    """What must match between the writer's cache and the reader's."""

    model: bytes
    n_layers: int
    n_kv_heads: int
    head_dim: int
    dtype: torch.dtype

    @classmethod
    def of(cls, cache: PagedKVCache, model: bytes) -> Layout:
        if len(model) != 32:
            raise ValueError("model is a 32-byte digest")
        return cls(model, cache.n_layers, cache.n_kv_heads, cache.head_dim, cache.dtype)

    def payload_bytes(self, n: int) -> int:
        return 2 * self.n_layers * n * self.n_kv_heads * self.head_dim * torch.finfo(self.dtype).bits // 8


@dataclass(frozen=True)
class Pages:
    """A copy of positions ``0..len(tokens)-1`` (never a view of the cache): ``k[layer]`` and
    ``v[layer]`` are ``[n, n_kv_heads, head_dim]`` on the cache's device."""

    layout: Layout
    block_size: int
    tokens: tuple[int, ...]
    k: list[torch.Tensor]
    v: list[torch.Tensor]

    def __len__(self) -> int:
        return len(self.tokens)


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n, limit = 0, min(len(a), len(b))
    while n < limit and a[n] == b[n]:
        n += 1
    return n


def snapshot(cache: PagedKVCache, session: bytes, committed: Sequence[int], model: bytes) -> Pages | None:
    """Copy the cached positions that hold ``committed``'s longest prefix (a proposal's
    rejected positions after it are not committed state). None when nothing is cached."""
    st = cache.seqs.get(session)
    if st is None:
        return None
    n = common_prefix(st.tokens, committed)
    if n == 0:
        return None
    table = cache.block_table([session])
    lens = torch.tensor([n], dtype=torch.int32, device=cache.device)
    k, v = [], []
    for layer in range(cache.n_layers):
        kl, vl = cache.gather(layer, table, lens)  # [n, H_kv, D], fresh tensors
        k.append(kl)
        v.append(vl)
    return Pages(Layout.of(cache, model), cache.block_size, tuple(st.tokens[:n]), k, v)


def encode(pages: Pages) -> memoryview:
    """The object's bytes: one buffer, each layer copied into it once (from the device, if the
    cache is on one), no intermediate concatenation."""
    lay, n = pages.layout, len(pages)
    start = HEADER_BYTES + 4 * n
    # From a GPU cache: page-locked, so the copies below are DMA transfers queued back to back.
    cuda = bool(pages.k) and pages.k[0].is_cuda
    out = torch.empty(start + lay.payload_bytes(n), dtype=torch.uint8, pin_memory=cuda)
    buf = out.numpy().data
    _HEAD.pack_into(buf, 0, MAGIC, lay.model, lay.n_layers, lay.n_kv_heads, lay.head_dim, _CODES[lay.dtype], 0,
                    pages.block_size, n)
    struct.pack_into(f">{n}I", buf, HEADER_BYTES, *pages.tokens)
    values = out[start:].view(lay.dtype).view(2 * lay.n_layers, n, lay.n_kv_heads, lay.head_dim)
    for layer, (k, v) in enumerate(zip(pages.k, pages.v, strict=True)):
        values[2 * layer].copy_(k, non_blocking=cuda)
        values[2 * layer + 1].copy_(v, non_blocking=cuda)
    if cuda:
        torch.cuda.current_stream(pages.k[0].device).synchronize()
    return buf


def decode(data: Any, expect: Layout, *, device: torch.device | str = "cpu") -> Pages:
    """Parse and check pages against ``expect`` (model digest and shape); PagesRefused otherwise.
    The values alias ``data`` when it is writable (a private copy, as ``Objects.get`` returns)."""
    raw = memoryview(data).cast("B")
    if len(raw) < HEADER_BYTES:
        raise PagesRefused("shorter than the header")
    magic, model, n_layers, heads, dim, code, _, block_size, n = _HEAD.unpack_from(raw, 0)
    if magic != MAGIC:
        raise PagesRefused("not target KV pages (bad magic)")
    if model != expect.model:
        raise PagesRefused("the pages are another model's (digest differs)")
    got = (n_layers, heads, dim, _DTYPES.get(code))
    want = (expect.n_layers, expect.n_kv_heads, expect.head_dim, expect.dtype)
    if got != want:
        raise PagesRefused(f"the pages' shape {got} is not this cache's {want}")
    start = HEADER_BYTES + 4 * n
    if len(raw) != start + expect.payload_bytes(n):
        raise PagesRefused(f"{len(raw)} bytes where the header says {start + expect.payload_bytes(n)}")
    tokens = struct.unpack_from(f">{n}I", raw, HEADER_BYTES)
    payload = raw[start:] if not raw.readonly else memoryview(bytearray(raw[start:]))
    count = 2 * n_layers * n * heads * dim
    flat = torch.frombuffer(payload, dtype=expect.dtype, count=count) if count else torch.empty(0, dtype=expect.dtype)
    values = flat.to(device).view(2 * n_layers, n, heads, dim)
    return Pages(expect, block_size, tokens, [values[2 * i] for i in range(n_layers)],
                 [values[2 * i + 1] for i in range(n_layers)])


def install(cache: PagedKVCache, session: bytes, pages: Pages, committed: Sequence[int]) -> int:
    """Make the session's cache hold the pages' positions, up to ``len(committed)`` (whatever it
    held before is dropped), so the next reconcile keeps them; how many. The pages' tokens must
    be a prefix of ``committed`` or extend it: any other difference refuses them all."""
    n = common_prefix(pages.tokens, committed)
    if n < min(len(pages), len(committed)):
        raise PagesRefused(f"the pages' token at position {n} is not the committed one")
    cache.release(session)
    if n == 0:
        return 0
    slots = torch.tensor(cache.append_slots(session, pages.tokens[:n]), dtype=torch.int64, device=cache.device)
    for layer in range(cache.n_layers):
        cache.write(layer, pages.k[layer][:n].contiguous(), pages.v[layer][:n].contiguous(), slots)
    return n


class PagedTargetKV:
    """:class:`~sdcp_fast.model.interfaces.TargetKV` over a paged cache (a
    :class:`~sdcp_fast.model.target_scorer.ModelRunner`'s ``cache``) for the model of digest ``model``."""

    def __init__(self, cache: PagedKVCache, model: bytes) -> None:
        self.cache = cache
        self.layout = Layout.of(cache, model)

    def export_kv(self, session: bytes, committed: Sequence[int]) -> Pages | None:
        return snapshot(self.cache, session, committed, self.layout.model)

    def encode_kv(self, pages: Any) -> memoryview:
        return encode(pages)

    def decode_kv(self, data: Any) -> Pages:
        return decode(data, self.layout, device=self.cache.device)

    def import_kv(self, session: bytes, pages: Any, committed: Sequence[int]) -> int:
        return install(self.cache, session, pages, committed)


def target_kv_of(scorer: Any, model: bytes) -> PagedTargetKV | None:
    """The pages adapter for a scorer that keeps a paged cache (None for one that does not,
    such as the toy target, which has no KV)."""
    own = getattr(scorer, "target_kv", None)
    if own is not None:
        return own  # type: ignore[no-any-return]
    cache = getattr(scorer, "cache", None)
    return PagedTargetKV(cache, model) if isinstance(cache, PagedKVCache) else None
