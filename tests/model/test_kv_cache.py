from __future__ import annotations

import pytest
import torch

from sdcp_fast.model.kv_cache import KVBlocksExhausted, PagedKVCache


def make(num_blocks: int = 4, max_blocks: int | None = None) -> PagedKVCache:
    return PagedKVCache(2, 1, 2, block_size=4, num_blocks=num_blocks, max_blocks=max_blocks)


def test_append_allocates_blocks_and_slots() -> None:
    c = make()
    slots = c.append_slots(b"a", list(range(6)))
    assert c.seqs[b"a"].blocks == [0, 1]
    assert slots == [0, 1, 2, 3, 4, 5]
    assert c.append_slots(b"b", [7]) == [8]  # block 2, offset 0
    assert c.append_slots(b"a", [9, 9, 9]) == [6, 7, 12]  # fills block 1, then block 3


def test_truncate_frees_whole_blocks_only() -> None:
    c = make()
    c.append_slots(b"a", list(range(9)))  # blocks 0, 1, 2
    before = c.k[0].clone()
    c.truncate(b"a", 5)  # positions 0..4 live in blocks 0 and 1
    assert c.seqs[b"a"].blocks == [0, 1]
    assert c.seqs[b"a"].tokens == [0, 1, 2, 3, 4]
    assert c.free[-1] == 2 and c.used_blocks() == 2
    assert torch.equal(c.k[0], before)  # nothing copied or cleared


def test_reconcile_keeps_common_prefix_but_recomputes_last() -> None:
    c = make()
    c.append_slots(b"a", [5, 6, 7, 8, 9])
    assert c.reconcile(b"a", [5, 6, 7, 1, 2, 3]) == 3
    assert c.seqs[b"a"].tokens == [5, 6, 7]
    assert c.reconcile(b"a", [5, 6, 7]) == 2  # the last committed position is recomputed
    assert c.reconcile(b"a", [5, 6, 7], keep_last=0) == 2  # already truncated to 2
    assert c.reconcile(b"b", [1]) == 0


def test_pool_grows_by_doubling_and_respects_its_cap() -> None:
    c = make(num_blocks=2, max_blocks=4)
    c.append_slots(b"a", list(range(8)))
    c.append_slots(b"b", list(range(8)))
    assert c.num_blocks == 4 and c.used_blocks() == 4
    with pytest.raises(KVBlocksExhausted):
        c.append_slots(b"c", [1])
    c.release(b"a")
    assert c.used_blocks() == 2 and b"a" not in c.seqs
    c.append_slots(b"c", [1])


def test_write_then_gather_roundtrip_through_block_tables() -> None:
    c = make()
    c.append_slots(b"x", [0])  # occupy block 0 so sessions do not start at slot 0
    slots_a = c.append_slots(b"a", list(range(6)))
    slots_b = c.append_slots(b"b", list(range(3)))
    va = torch.randn(6, 1, 2)
    vb = torch.randn(3, 1, 2)
    c.write(0, torch.cat([va, vb]), torch.cat([va, vb]) * 2, torch.tensor(slots_a + slots_b))
    table = c.block_table([b"a", b"b"])
    k, v = c.gather(0, table, torch.tensor([6, 3], dtype=torch.int32))
    assert torch.equal(k, torch.cat([va, vb]))
    assert torch.equal(v, torch.cat([va, vb]) * 2)
