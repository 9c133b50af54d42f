import pytest
import torch

from sdcp_fast.kernels import gather_paged_kv, write_paged_kv

from .support import backend_params, device_of

BACKENDS = backend_params("reference", "cpu", "triton")
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _layout(gen: torch.Generator, lens: list[int], block_size: int, num_blocks: int) -> torch.Tensor:
    """A block table using distinct, shuffled blocks, padded with -1."""
    need = [(n + block_size - 1) // block_size for n in lens]
    max_blocks = max(max(need), 1)
    perm = torch.randperm(num_blocks, generator=gen)
    table = torch.full((len(lens), max_blocks), -1, dtype=torch.int32)
    used = 0
    for b, k in enumerate(need):
        table[b, :k] = perm[used : used + k].to(torch.int32)
        used += k
    return table


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_write_then_gather_round_trips(backend: str, dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(1)
    block_size, heads, dim, num_blocks = 16, 3, 40, 32
    lens = [1, 17, 0, 33, 16]
    table = _layout(gen, lens, block_size, num_blocks)
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    cache = torch.zeros(num_blocks, block_size, heads, dim, dtype=dtype)
    values = torch.randn(sum(lens), heads, dim, generator=gen).to(dtype)
    slots = torch.cat([
        table[b, torch.arange(n) // block_size].to(torch.int64) * block_size + torch.arange(n) % block_size
        for b, n in enumerate(lens)
    ])
    dev = device_of(backend)
    cache = cache.to(dev)
    write_paged_kv(cache, values.to(dev), slots.to(dev), backend=backend)
    assert torch.equal(gather_paged_kv(cache, table.to(dev), seq_lens.to(dev), backend=backend).cpu(), values)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_matches_reference_with_skipped_slots(backend: str, dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(2)
    cache = torch.randn(9, 8, 2, 64, generator=gen).to(dtype)
    values = torch.randn(30, 2, 64, generator=gen).to(dtype)
    slots = torch.randperm(72, generator=gen)[:30]
    slots[::4] = -1
    want = cache.clone()
    write_paged_kv(want, values, slots, backend="reference")
    dev = device_of(backend)
    there = cache.to(dev)
    write_paged_kv(there, values.to(dev), slots.to(dev), backend=backend)
    assert torch.equal(there.cpu(), want)
    cache = want
    table = torch.randint(0, 9, (4, 5), generator=gen, dtype=torch.int32)  # blocks may repeat when read
    seq_lens = torch.tensor([40, 0, 3, 9], dtype=torch.int32)
    assert torch.equal(gather_paged_kv(cache.to(dev), table.to(dev), seq_lens.to(dev), backend=backend).cpu(),
                       gather_paged_kv(cache, table, seq_lens, backend="reference"))


def test_layout_is_block_major() -> None:
    cache = torch.zeros(4, 2, 1, 1)
    write_paged_kv(cache, torch.tensor([[[5.0]]]), torch.tensor([7]), backend="reference")
    assert cache[3, 1, 0, 0] == 5.0
    out = gather_paged_kv(cache, torch.tensor([[3, 0]], dtype=torch.int32), torch.tensor([2], dtype=torch.int32),
                          backend="reference")
    assert out.flatten().tolist() == [0.0, 5.0]


@pytest.mark.parametrize("bad", [
    dict(slot_mapping=torch.tensor([8])),
    dict(slot_mapping=torch.tensor([0], dtype=torch.int32)),
    dict(values=torch.zeros(1, 1, 2)),
])
def test_write_rejects_bad_arguments(bad: dict[str, torch.Tensor]) -> None:
    args = dict(cache=torch.zeros(4, 2, 1, 1), values=torch.zeros(1, 1, 1), slot_mapping=torch.tensor([0]))
    args.update(bad)
    with pytest.raises(ValueError):
        write_paged_kv(**args)


def test_gather_rejects_too_long_sessions() -> None:
    with pytest.raises(ValueError, match="seq_lens"):
        gather_paged_kv(torch.zeros(4, 2, 1, 1), torch.zeros(1, 2, dtype=torch.int32),
                        torch.tensor([5], dtype=torch.int32))
