"""Row-invariant float kernels (csrc/rowwise_kernels.cpp) against their plain-torch definition,
under every instruction set this CPU runs, on odd shapes (lengths that are not a multiple of
the vector width, one row, more rows than a row group, GQA, several sessions, windows,
soft-capping); and the property they exist for: a row's bits do not depend on the other rows
of the call."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from sdcp_fast import native
from sdcp_fast.kernels import quant, rowwise
from sdcp_fast.kernels import rowwise_reference as ref

ISAS = quant.isas() if native.available() else ["none"]


@pytest.fixture(params=ISAS)
def isa(request: pytest.FixtureRequest) -> Iterator[str]:
    if not rowwise.available():
        pytest.skip(native.status())
    before = quant.isa()
    quant.use_isa(request.param)
    yield request.param
    quant.use_isa(before)


def _g(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _rows_alone(f, *rows_args: torch.Tensor) -> torch.Tensor:  # type: ignore[no-untyped-def]
    """``f`` called on each row alone, the results stacked."""
    return torch.cat([f(*(a[i:i + 1] for a in rows_args)) for i in range(rows_args[0].shape[0])])


@pytest.mark.usefixtures("isa")
@pytest.mark.parametrize(("t", "dim"), [(1, 8), (3, 37), (11, 64), (9, 576)])
@pytest.mark.parametrize("unit", [False, True])
def test_add_rms_norm(t: int, dim: int, unit: bool) -> None:
    g = _g(t + dim)
    x, delta, w = torch.randn(t, dim, generator=g), torch.randn(t, dim, generator=g), torch.rand(dim, generator=g)
    want_x, got_x = x.clone(), x.clone()
    want = ref.add_rms_norm(want_x, delta, w, 1e-5, unit)
    got = rowwise.add_rms_norm(got_x, delta, w, 1e-5, unit, backend="cpu")
    torch.testing.assert_close(got_x, want_x, rtol=0, atol=0)  # the residual add is exact
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(rowwise.add_rms_norm(x, None, w, 1e-5, unit, backend="cpu"),
                               ref.add_rms_norm(x.clone(), None, w, 1e-5, unit), rtol=1e-5, atol=1e-6)
    alone = _rows_alone(lambda r: rowwise.add_rms_norm(r.contiguous(), None, w, 1e-5, unit, backend="cpu"), x)
    assert torch.equal(alone, rowwise.add_rms_norm(x, None, w, 1e-5, unit, backend="cpu"))


@pytest.mark.usefixtures("isa")
@pytest.mark.parametrize(("t", "k", "n"), [(1, 1, 1), (1, 37, 5), (2, 8, 9), (5, 64, 67), (9, 100, 130),
                                           (17, 576, 33)])
@pytest.mark.parametrize("bias", [False, True])
def test_linear(t: int, k: int, n: int, bias: bool) -> None:
    g = _g(t * k + n)
    x, w = torch.randn(t, k, generator=g), torch.randn(n, k, generator=g)
    b = torch.randn(n, generator=g) if bias else None
    got = rowwise.linear(x, w, b, backend="cpu")
    torch.testing.assert_close(got, ref.linear(x, w, b), rtol=1e-5, atol=1e-5 * k ** 0.5)
    assert torch.equal(_rows_alone(lambda r: rowwise.linear(r, w, b, backend="cpu"), x), got)
    assert torch.equal(rowwise.linear(x, w, b, backend="cpu", threads=2), got)


@pytest.mark.usefixtures("isa")
@pytest.mark.parametrize("act", ["silu", "gelu_tanh"])
def test_gated_act_on_halves_of_one_product(act: str) -> None:
    gu = torch.randn(7, 2 * 45, generator=_g()) * 4
    got = rowwise.gated_act(gu[:, :45], gu[:, 45:], act, backend="cpu")
    torch.testing.assert_close(got, ref.gated_act(gu[:, :45], gu[:, 45:], act), rtol=1e-5, atol=1e-6)
    assert torch.equal(_rows_alone(lambda r: rowwise.gated_act(r[:, :45], r[:, 45:], act, backend="cpu"), gu), got)


def test_rope_table_matches_torch() -> None:
    if not rowwise.available():
        pytest.skip(native.status())
    pos = torch.tensor([0, 1, 7, 300, 4095])
    inv = 1.0 / (10000.0 ** (torch.arange(0, 10, 2, dtype=torch.float64) / 10)).float()
    for got, want in zip(rowwise.rope_table(pos, inv, backend="cpu"), ref.rope_table(pos, inv), strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=2e-6)


def _layout(g: torch.Generator, lens: list[int], block: int, hkv: int, d: int):  # type: ignore[no-untyped-def]
    """Caches holding ``lens[b]`` positions for each session b in shuffled blocks."""
    per = [(n + block - 1) // block for n in lens]
    width = max(per)
    blocks = torch.randperm(sum(per) + 3, generator=g)[: sum(per)].to(torch.int32)
    table = torch.zeros(len(lens), width, dtype=torch.int32)
    at = 0
    for b, n in enumerate(per):
        table[b, :n] = blocks[at:at + n]
        at += n
    shape = (sum(per) + 3, block, hkv, d)
    return torch.randn(shape, generator=g), torch.randn(shape, generator=g), table


@pytest.mark.usefixtures("isa")
@pytest.mark.parametrize(("hq", "hkv", "d"), [(1, 1, 2), (6, 2, 10), (9, 3, 64), (4, 4, 13 * 2)])
@pytest.mark.parametrize(("window", "softcap"), [(None, None), (3, None), (None, 5.0), (2, 1.5)])
def test_paged_attention_rows(hq: int, hkv: int, d: int, window: int | None, softcap: float | None) -> None:
    g = _g(hq * d)
    lens, block = [5, 1, 17], 3
    k_cache, v_cache, table = _layout(g, lens, block, hkv, d)
    q_lens = [2, 1, 5]  # each session's last rows
    row_seq = torch.repeat_interleave(torch.arange(3, dtype=torch.int32), torch.tensor(q_lens))
    row_pos = torch.cat([torch.arange(n - q, n) for n, q in zip(lens, q_lens, strict=True)])
    q = torch.randn(len(row_pos), hq, d, generator=g) * 2
    got = rowwise.paged_attention_rows(q, k_cache, v_cache, table, row_seq, row_pos, 0.3, window, softcap,
                                       backend="cpu")
    want = ref.paged_attention_rows(q, k_cache, v_cache, table, row_seq, row_pos, 0.3, window, softcap)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=2e-6)
    alone = _rows_alone(lambda qr, s, p: rowwise.paged_attention_rows(
        qr.contiguous(), k_cache, v_cache, table, s, p, 0.3, window, softcap, backend="cpu"), q, row_seq, row_pos)
    assert torch.equal(alone, got)
    assert torch.equal(got, rowwise.paged_attention_rows(q, k_cache, v_cache, table, row_seq, row_pos, 0.3, window,
                                                         softcap, backend="cpu", threads=2))


@pytest.mark.usefixtures("isa")
def test_rope_append_from_one_fused_product() -> None:
    g = _g()
    t, hq, hkv, d, block = 5, 6, 2, 10, 4
    qkv = torch.randn(t, (hq + 2 * hkv) * d, generator=g)
    q = qkv[:, : hq * d].view(t, hq, d)
    k = qkv[:, hq * d: (hq + hkv) * d].view(t, hkv, d)
    v = qkv[:, (hq + hkv) * d:].view(t, hkv, d)
    cos, sin = ref.rope_table(torch.tensor([3, 4, 5, 9, 10]), torch.rand(d // 2, generator=g))
    slots = torch.tensor([6, 7, 1, 0, -1])
    caches = [torch.zeros(3, block, hkv, d) for _ in range(4)]
    got = rowwise.rope_append(q, k, v, cos, sin, slots, caches[0], caches[1], backend="cpu")
    want = ref.rope_append(q, k, v, cos, sin, slots, caches[2], caches[3])
    assert torch.equal(got, want)  # the same products and sums, rounded alike
    assert torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])


def test_reference_without_the_native_build(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rowwise, "available", lambda: False)
    x, w = torch.randn(3, 8), torch.randn(5, 8)
    torch.testing.assert_close(rowwise.linear(x, w), ref.linear(x, w))
    with pytest.raises(native.NativeUnavailable):
        rowwise.linear(x, w, backend="cpu")
