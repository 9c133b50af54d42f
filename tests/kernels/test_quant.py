"""Quantized-weight products: the block formats (GGUF's bytes), the packed layout the kernels
read, the plain-torch reference against "dequantize, then matmul", and the C++ kernels under
every instruction set this CPU runs against the reference, on odd shapes (N not a multiple of
the 8-row packing, one block, one row, rows that are not a multiple of the kernels' row group)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from sdcp_fast import native
from sdcp_fast.kernels import quant
from sdcp_fast.kernels import quant_reference as ref

KINDS = ["q8_0", "q4_0", "q4_1"]
SHAPES = [(1, 32, 1), (7, 32, 3), (33, 96, 5), (17, 160, 9), (130, 64, 13)]  # (N, K, T)

ISAS = quant.isas() if native.available() else ["none"]
needs_native = pytest.mark.skipif(not native.available(), reason=native.status())


@pytest.fixture(params=ISAS)
def isa(request: pytest.FixtureRequest) -> Iterator[str]:
    if not native.available():
        pytest.skip(native.status())
    before = quant.isa()
    quant.use_isa(request.param)
    yield request.param
    quant.use_isa(before)


def _case(kind: str, n: int, k: int, t: int, seed: int = 0) -> tuple[torch.Tensor, ref.QuantWeight]:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * torch.rand(n, 1, generator=g)
    return torch.randn(t, k, generator=g), quant.quantize(w, kind)


@pytest.mark.parametrize("kind", KINDS)
def test_round_trip_error_is_within_a_step(kind: str) -> None:
    """Half a step, except Q4_0: its scale maps the largest magnitude to -8, so a value of
    the other sign and the same size clamps at +7 (a whole step off)."""
    w = torch.randn(19, 64)
    qw = quant.quantize(w, kind)
    back = quant.dequantize(qw)
    blocks = w.reshape(19, 2, 32)
    span = blocks.amax(-1) - blocks.amin(-1)  # q4_1's step is span / 15
    step = {"q8_0": blocks.abs().amax(-1) / 127, "q4_0": blocks.abs().amax(-1) / 8, "q4_1": span / 15}[kind]
    err = (back - w).abs().reshape(19, 2, 32).amax(-1)
    assert torch.all(err <= step * (1.0 if kind == "q4_0" else 0.5) * 1.01 + 1e-6)


@pytest.mark.parametrize("kind", KINDS)
def test_blocks_match_gguf_layout(kind: str) -> None:
    gguf = pytest.importorskip("gguf")
    import numpy as np

    w = torch.randn(5, 64)
    qtype = getattr(gguf.GGMLQuantizationType, kind.upper())
    raw = gguf.quants.quantize(w.numpy(), qtype)  # [5, row bytes], llama.cpp's reference rounding
    qw = ref.QuantWeight(kind, torch.from_numpy(np.ascontiguousarray(raw)), 5, 64)
    want = torch.from_numpy(np.array(gguf.quants.dequantize(raw, qtype), dtype=np.float32))
    assert torch.equal(quant.dequantize(qw), want)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("shape", SHAPES)
def test_reference_is_dequantize_then_matmul_up_to_activation_rounding(kind: str, shape: tuple[int, int, int]) -> None:
    n, k, t = shape
    x, qw = _case(kind, n, k, t)
    got = ref.quant_matmul(x, qw)
    plain = ref.dequant_matmul(x, qw)
    # Each activation moves by at most half a step of its block, max|x| / 254.
    bound = (x.abs().reshape(t, -1, 32).amax(-1) / 254).repeat_interleave(32, -1) @ quant.dequantize(qw).abs().T
    assert torch.all((got - plain).abs() <= bound * 1.001 + 1e-5)
    q, d, _ = ref.quantize_activations(x)
    exact = (q.float().reshape(t, -1, 32) * d[..., None]).reshape(t, k).double() @ quant.dequantize(qw).double().T
    torch.testing.assert_close(got.double(), exact, rtol=1e-5, atol=1e-5)


@needs_native
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("shape", SHAPES)
def test_kernel_matches_reference(isa: str, kind: str, shape: tuple[int, int, int]) -> None:
    n, k, t = shape
    x, qw = _case(kind, n, k, t, seed=n + k + t)
    got = quant.quant_matmul(x, qw, backend="cpu")
    torch.testing.assert_close(got, ref.quant_matmul(x, qw), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("shape", SHAPES)
def test_pack_is_a_reordering_that_unpack_undoes(kind: str, shape: tuple[int, int, int]) -> None:
    n, k, _ = shape
    _, qw = _case(kind, n, k, 1)
    p = quant.pack(qw)
    assert p.data.shape == (-(-n // 8), k // 32 * 8 * ref.BLOCK_BYTES[kind])
    assert torch.equal(quant.unpack(p).blocks, qw.blocks)
    # Bytes only move: the padding rows are zero, the rest is the GGUF bytes in another order.
    assert torch.equal(p.data.flatten().sort().values[-qw.blocks.numel():], qw.blocks.flatten().sort().values)


@pytest.mark.parametrize("kind", KINDS)
def test_packed_layout(kind: str) -> None:
    """Group 1 (rows 8..15), block 1: the 8 scales, Q4_1's mins, then piece p = bytes 4p..4p+3
    of each row's values, row after row."""
    _, qw = _case(kind, 19, 64, 1)
    size, head = ref.BLOCK_BYTES[kind], 4 if kind == "q4_1" else 2
    blocks = qw.blocks.reshape(19, 2, size)
    got = quant.pack(qw).data[1].reshape(2, 8 * size)[1]
    want = [blocks[8:16, 1, 0:2].flatten()]
    if kind == "q4_1":
        want.append(blocks[8:16, 1, 2:4].flatten())
    want += [blocks[8:16, 1, head + 4 * p:head + 4 * p + 4].flatten() for p in range((size - head) // 4)]
    assert torch.equal(got, torch.cat(want))
    last = quant.pack(qw).data[2].reshape(2, 8 * size)  # rows 16..18 and five zero rows
    assert torch.equal(quant.unpack(quant.pack(qw)).blocks[16:], qw.blocks[16:]) and last.any()


@needs_native
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("shape", SHAPES)
def test_kernel_on_packed_weights_matches_reference(isa: str, kind: str, shape: tuple[int, int, int]) -> None:
    n, k, t = shape
    x, qw = _case(kind, n, k, t, seed=2 * n + k + t)
    p = quant.pack(qw)
    got = quant.launcher(p, backend="cpu")(x)
    torch.testing.assert_close(got, ref.quant_matmul(x, qw), rtol=1e-5, atol=1e-4)
    assert torch.equal(ref.quant_matmul(x, p), ref.quant_matmul(x, qw))
    assert torch.equal(quant.quant_matmul(x, p, backend="cpu"), got)


@needs_native
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("view", ["transposed", "strided"])
def test_launcher_reads_non_contiguous_activations_by_their_strides(kind: str, view: str) -> None:
    """The kernel reads ``x`` by address as ``[T, K]`` rows: a view with other strides must
    multiply the values it shows, not the bytes behind it."""
    x, qw = _case(kind, 17, 96, 5, seed=3)
    # The same values, held where a dense read of the address would find others.
    held = x.T.contiguous().T if view == "transposed" else torch.cat([x, -x], 1)[:, :96]
    assert not held.is_contiguous() and torch.equal(held, x)
    got = quant.launcher(quant.pack(qw), backend="cpu")(held)
    torch.testing.assert_close(got, ref.quant_matmul(x, qw), rtol=1e-5, atol=1e-4)


@needs_native
@pytest.mark.parametrize("kind", KINDS)
def test_a_row_gets_the_same_bits_alone_or_in_a_batch(isa: str, kind: str) -> None:
    x, qw = _case(kind, 300, 192, 11)
    together = quant.quant_matmul(x, qw, backend="cpu", threads=2)
    for i in range(11):
        alone = quant.quant_matmul(x[i:i + 1], qw, backend="cpu", threads=1)
        assert torch.equal(alone[0], together[i])


@needs_native
def test_activation_blocks_match_the_reference() -> None:
    x = torch.randn(3, 96) * 4
    x[1, :32] = 0  # an all-zero block: scale 0
    q = torch.empty(3, 96, dtype=torch.int8)
    d = torch.empty(3, 3)
    s = torch.empty(3, 3)
    native.module().quantize_activations(x.data_ptr(), 3, 96, q.data_ptr(), d.data_ptr(), s.data_ptr())
    rq, rd, rs = ref.quantize_activations(x)
    assert torch.equal(q, rq) and torch.equal(d, rd) and torch.equal(s, rs)


def test_leading_dimensions_and_bad_shapes() -> None:
    x, qw = _case("q4_1", 9, 64, 6)
    out = quant.quant_matmul(x.reshape(2, 3, 64), qw, backend="reference")
    assert out.shape == (2, 3, 9)
    with pytest.raises(ValueError, match="columns"):
        quant.quant_matmul(torch.randn(2, 32), qw)
    with pytest.raises(ValueError, match="multiple of 32"):
        quant.quantize(torch.randn(2, 40), "q8_0")
    with pytest.raises(ValueError, match="quant kind"):
        quant.quantize(torch.randn(2, 32), "q5_k")
    with pytest.raises(ValueError, match="uint8"):
        ref.QuantWeight("q8_0", torch.zeros(2, 33, dtype=torch.uint8), 2, 32)
    with pytest.raises(ValueError, match="packed"):
        ref.PackedWeight("q8_0", torch.zeros(2, 34 * 8, dtype=torch.uint8), 17, 32)  # 17 rows need 3 groups
