"""Quantized weights in GGUF's block formats, in plain torch: the definition the C++ kernels
(``csrc/quant_kernels.cpp``) are tested against.

A weight ``[N, K]`` (``K`` a multiple of 32) is kept as ``N`` rows of ``K / 32`` blocks, byte
for byte as a GGUF file stores them:

- ``Q8_0`` (34 bytes): float16 scale ``d``, 32 int8 ``q``; value ``d * q``.
- ``Q4_0`` (18 bytes): float16 ``d``, 16 bytes of nibbles; value ``d * (u - 8)``.
- ``Q4_1`` (20 bytes): float16 ``d``, float16 ``m``, 16 bytes of nibbles; value ``d * u + m``.

Nibbles: byte ``j`` holds value ``j`` in its low four bits and value ``j + 16`` in its high four.

:func:`pack` reorders those bytes into the layout the C++ products read (a
:class:`PackedWeight`, made once at load; :func:`unpack` is its exact inverse): the output rows
in groups of ``PACK_COLS`` = 8 (the last group padded with zero rows); per group and block, the 8
rows' float16 scales, for Q4_1 their 8 mins, then the values in 32-byte pieces, piece ``p``
holding bytes ``4p .. 4p + 3`` of each row's values, row after row. One 256-bit vector then holds
4 values of 8 rows (Q8_0: values ``4p .. 4p + 3``; Q4: ``4p .. 4p + 3`` in the low nibbles,
``16 + 4p ..`` in the high ones), so one broadcast of 4 activation bytes multiplies all 8 rows.

The product :func:`quant_matmul` quantizes each 32-value block of the activations to int8
(scale ``max|x| / 127``, round half to even), takes the exact integer dot product of each
pair of blocks and scales it: what the kernels compute, up to the order float32 terms are
summed in. :func:`dequant_matmul` is the plain "dequantize, then matmul" product; the two
differ by the activations' rounding (relative error about 1/254 per block).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

BLOCK = 32
# Kind codes must match csrc/quant_kernels.h.
QUANT_KINDS = {"q8_0": 0, "q4_0": 1, "q4_1": 2}
BLOCK_BYTES = {"q8_0": 34, "q4_0": 18, "q4_1": 20}
PACK_COLS = 8  # must match kQuantPackCols in csrc/quant_kernels.h


@dataclass(frozen=True)
class QuantWeight:
    """``blocks``: uint8 ``[N, K / 32 * BLOCK_BYTES[kind]]``, GGUF's layout."""

    kind: str
    blocks: torch.Tensor
    n: int
    k: int

    def __post_init__(self) -> None:
        if self.kind not in QUANT_KINDS:
            raise ValueError(f"quant kind must be one of {sorted(QUANT_KINDS)}, not {self.kind!r}")
        if self.k % BLOCK:
            raise ValueError(f"k = {self.k} is not a multiple of {BLOCK}")
        want = (self.n, self.k // BLOCK * BLOCK_BYTES[self.kind])
        if self.blocks.dtype != torch.uint8 or tuple(self.blocks.shape) != want:
            raise ValueError(f"{self.kind} blocks must be uint8 {want}, not {self.blocks.dtype} "
                             f"{tuple(self.blocks.shape)}")

    @property
    def nbytes(self) -> int:
        return self.blocks.numel()


@dataclass(frozen=True)
class PackedWeight:
    """``data``: uint8 ``[ceil(N / 8), K / 32 * 8 * BLOCK_BYTES[kind]]``, :func:`pack`'s layout."""

    kind: str
    data: torch.Tensor
    n: int
    k: int

    def __post_init__(self) -> None:
        if self.kind not in QUANT_KINDS:
            raise ValueError(f"quant kind must be one of {sorted(QUANT_KINDS)}, not {self.kind!r}")
        if self.k % BLOCK:
            raise ValueError(f"k = {self.k} is not a multiple of {BLOCK}")
        want = (-(-self.n // PACK_COLS), self.k // BLOCK * PACK_COLS * BLOCK_BYTES[self.kind])
        if self.data.dtype != torch.uint8 or tuple(self.data.shape) != want:
            raise ValueError(f"packed {self.kind} must be uint8 {want}, not {self.data.dtype} "
                             f"{tuple(self.data.shape)}")

    @property
    def nbytes(self) -> int:
        return self.data.numel()


def _head(kind: str) -> int:
    """Bytes of a block before its values: the scale, and Q4_1's min."""
    return 4 if kind == "q4_1" else 2


def pack(w: QuantWeight) -> PackedWeight:
    """``w``'s blocks in the products' layout (see the module docstring)."""
    nb, size, head = w.k // BLOCK, BLOCK_BYTES[w.kind], _head(w.kind)
    groups = -(-w.n // PACK_COLS)
    b = torch.zeros(groups * PACK_COLS, nb, size, dtype=torch.uint8)
    b[: w.n] = w.blocks.reshape(w.n, nb, size)
    b = b.reshape(groups, PACK_COLS, nb, size).transpose(1, 2)  # [G, nb, 8 rows, size]
    parts = [b[..., i:i + 2].reshape(groups, nb, 2 * PACK_COLS) for i in range(0, head, 2)]
    vals = b[..., head:].reshape(groups, nb, PACK_COLS, -1, 4).transpose(2, 3)  # [G, nb, piece, row, 4]
    parts.append(vals.reshape(groups, nb, -1))
    return PackedWeight(w.kind, torch.cat(parts, -1).reshape(groups, -1).contiguous(), w.n, w.k)


def unpack(p: PackedWeight) -> QuantWeight:
    """The GGUF blocks ``p`` was packed from."""
    nb, size, head = p.k // BLOCK, BLOCK_BYTES[p.kind], _head(p.kind)
    groups = p.data.shape[0]
    g = p.data.reshape(groups, nb, PACK_COLS * size)
    parts = [g[..., i * PACK_COLS:(i + 2) * PACK_COLS].reshape(groups, nb, PACK_COLS, 2) for i in range(0, head, 2)]
    vals = g[..., head * PACK_COLS:].reshape(groups, nb, -1, PACK_COLS, 4).transpose(2, 3)
    parts.append(vals.reshape(groups, nb, PACK_COLS, -1))
    b = torch.cat(parts, -1).transpose(1, 2).reshape(groups * PACK_COLS, nb * size)[: p.n]
    return QuantWeight(p.kind, b.contiguous(), p.n, p.k)


def _split(w: QuantWeight) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """Scales ``d`` and mins ``m`` ``[N, K/32]`` float32 and raw values ``[N, K/32, 32]``
    (int8 for Q8_0, nibbles 0..15 for Q4)."""
    b = w.blocks.reshape(w.n, w.k // BLOCK, BLOCK_BYTES[w.kind])
    d = b[..., :2].contiguous().view(torch.float16)[..., 0].float()
    if w.kind == "q8_0":
        return d, None, b[..., 2:].contiguous().view(torch.int8)
    head = _head(w.kind)
    m = b[..., 2:4].contiguous().view(torch.float16)[..., 0].float() if w.kind == "q4_1" else None
    qs = b[..., head:]
    return d, m, torch.cat([qs & 0x0F, qs >> 4], dim=-1)


def dequantize(w: QuantWeight) -> torch.Tensor:
    """float32 ``[N, K]``."""
    d, m, q = _split(w)
    if w.kind == "q8_0":
        v = d[..., None] * q.float()
    elif w.kind == "q4_0":
        v = d[..., None] * (q.float() - 8)
    else:
        assert m is not None
        v = d[..., None] * q.float() + m[..., None]
    return v.reshape(w.n, w.k)


def _pack(kind: str, d: torch.Tensor, q: torch.Tensor, m: torch.Tensor | None = None) -> torch.Tensor:
    n, nb = d.shape
    parts = [d.to(torch.float16).view(torch.uint8).reshape(n, nb, 2)]
    if m is not None:
        parts.append(m.to(torch.float16).view(torch.uint8).reshape(n, nb, 2))
    if kind == "q8_0":
        parts.append(q.to(torch.int8).view(torch.uint8))
    else:
        u = q.to(torch.uint8)
        parts.append(u[..., :16] | (u[..., 16:] << 4))
    return torch.cat(parts, dim=-1).reshape(n, -1).contiguous()


def quantize(w: torch.Tensor, kind: str) -> QuantWeight:
    """Round a float weight ``[N, K]`` to ``kind``'s blocks (round to nearest within each
    block's range; the scale is rounded to float16 first, so values use the stored scale)."""
    if kind not in QUANT_KINDS:
        raise ValueError(f"quant kind must be one of {sorted(QUANT_KINDS)}, not {kind!r}")
    n, k = w.shape
    if k % BLOCK:
        raise ValueError(f"k = {k} is not a multiple of {BLOCK}")
    x = w.detach().float().reshape(n, k // BLOCK, BLOCK)
    if kind == "q8_0":
        d = (x.abs().amax(-1) / 127).half().float()
        q = torch.round(x / torch.where(d == 0, 1, d)[..., None]).clamp(-127, 127)
        return QuantWeight(kind, _pack(kind, d, q), n, k)
    if kind == "q4_0":
        # The scale carries the sign of the largest-magnitude value so that it maps to -8 exactly.
        big = x.gather(-1, x.abs().argmax(-1, keepdim=True))[..., 0]
        d = (big / -8).half().float()
        q = (torch.round(x / torch.where(d == 0, 1, d)[..., None]) + 8).clamp(0, 15)
        return QuantWeight(kind, _pack(kind, d, q), n, k)
    lo, hi = x.amin(-1), x.amax(-1)
    d = ((hi - lo) / 15).half().float()
    m = lo.half().float()
    q = torch.round((x - m[..., None]) / torch.where(d == 0, 1, d)[..., None]).clamp(0, 15)
    return QuantWeight(kind, _pack(kind, d, q, m), n, k)


def quantize_activations(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``x`` float32 ``[T, K]`` -> int8 ``q`` ``[T, K]``, scale ``d`` and ``d * sum(q)``
    ``[T, K/32]`` (float32 arithmetic, as the kernels do it)."""
    t, k = x.shape
    b = x.float().reshape(t, k // BLOCK, BLOCK)
    d = b.abs().amax(-1) / 127
    inv = torch.where(d != 0, 1 / torch.where(d != 0, d, 1), torch.zeros_like(d))
    q = torch.round(b * inv[..., None])
    return q.to(torch.int8).reshape(t, k), d, d * q.sum(-1)


def quant_matmul(x: torch.Tensor, w: QuantWeight | PackedWeight) -> torch.Tensor:
    """``x`` float32 ``[T, K]`` times ``w`` transposed: float32 ``[T, N]``. Block sums are
    exact; the scaled terms are added in float64."""
    if isinstance(w, PackedWeight):
        w = unpack(w)
    q, d, s = quantize_activations(x)
    t = x.shape[0]
    nb = w.k // BLOCK
    dw, mw, qw = _split(w)
    qx = q.reshape(t, nb, BLOCK).to(torch.int64)
    isum = torch.einsum("tbj,nbj->tnb", qx, qw.to(torch.int64)).double()  # [T, N, nb], exact
    terms = isum * (dw.double()[None] * d.double()[:, None])
    if w.kind == "q4_0":
        terms = terms - 8 * dw.double()[None] * s.double()[:, None]
    elif w.kind == "q4_1":
        assert mw is not None
        terms = terms + mw.double()[None] * s.double()[:, None]
    return terms.sum(-1).float()


def dequant_matmul(x: torch.Tensor, w: QuantWeight) -> torch.Tensor:
    """The plain product: dequantize, then matmul (float64)."""
    return (x.double() @ dequantize(w).double().T).float()
