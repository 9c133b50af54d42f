"""Paged attention: every backend equals the reference, and the reference equals dense causal
attention over the same keys (torch's scaled_dot_product_attention)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from sdcp_fast.kernels import paged_attention

from .support import backend_params, call

ALL = backend_params("reference", "cpu", "triton")


def _case(seed: int, seq_lens: list[int], q_lens: list[int], heads: int, kv_heads: int, dim: int, block: int,
          dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """A cache whose sessions own shuffled blocks, and each session's last q_len positions as queries."""
    gen = torch.Generator().manual_seed(seed)
    need = [-(-n // block) for n in seq_lens]
    num_blocks = sum(need) + 3
    order = torch.randperm(num_blocks, generator=gen)
    table = torch.full((len(seq_lens), max(need) + 1), -1, dtype=torch.int32)  # -1 past the last block: never read
    start = 0
    for b, k in enumerate(need):
        table[b, :k] = order[start : start + k].to(torch.int32)
        start += k
    k_cache = torch.randn(num_blocks, block, kv_heads, dim, generator=gen).to(dtype)
    v_cache = torch.randn(num_blocks, block, kv_heads, dim, generator=gen).to(dtype)
    q = torch.randn(sum(q_lens), heads, dim, generator=gen).to(dtype)
    cu_q = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()])
    return dict(q=q, k_cache=k_cache, v_cache=v_cache, block_table=table,
                seq_lens=torch.tensor(seq_lens, dtype=torch.int32), cu_q=cu_q)


CASES = [  # (seq_lens, q_lens, H, H_kv, D, block_size)
    ([5], [1], 4, 4, 16, 4),  # decode, one session, MHA
    ([17, 3, 40], [1, 1, 1], 8, 2, 32, 16),  # decode, GQA 4, partial last blocks
    ([9, 30], [5, 3], 6, 2, 24, 8),  # verify rows (M + 1), GQA 3, D not a power of 2
    ([12, 7, 20], [4, 0, 2], 4, 1, 16, 4),  # a session without queries, MQA
]


@pytest.mark.parametrize("backend", ALL)
@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_reference(backend: str, case: int, dtype: torch.dtype) -> None:
    seq_lens, q_lens, heads, kv_heads, dim, block = CASES[case]
    args = _case(case, seq_lens, q_lens, heads, kv_heads, dim, block, dtype)
    want = paged_attention(**args, backend="reference")
    got = call(paged_attention, **args, backend=backend)
    tol = dict(rtol=1e-4, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(got.float(), want.float(), **tol)
    assert got.dtype == dtype and got.shape == args["q"].shape


def test_reference_is_causal_attention() -> None:
    seq_lens, q_lens, heads, kv_heads, dim, block = [11, 6], [4, 6], 4, 2, 16, 4
    args = _case(9, seq_lens, q_lens, heads, kv_heads, dim, block, torch.float32)
    out = paged_attention(**args, backend="reference", scale=0.3)
    flat_k = args["k_cache"].view(-1, kv_heads, dim)
    flat_v = args["v_cache"].view(-1, kv_heads, dim)
    for b, (n, t) in enumerate(zip(seq_lens, q_lens, strict=True)):
        pos = torch.arange(n)
        slots = args["block_table"][b, pos // block].long() * block + pos % block
        k, v = flat_k[slots].transpose(0, 1), flat_v[slots].transpose(0, 1)  # [Hkv, n, D]
        q = args["q"][int(args["cu_q"][b]) : int(args["cu_q"][b + 1])].transpose(0, 1)  # [H, t, D]
        mask = torch.arange(n)[None, :] <= (n - t + torch.arange(t))[:, None]
        want = F.scaled_dot_product_attention(q[None], k[None], v[None], attn_mask=mask, scale=0.3,
                                              enable_gqa=True)[0].transpose(0, 1)
        torch.testing.assert_close(out[int(args["cu_q"][b]) : int(args["cu_q"][b + 1])], want, rtol=1e-5, atol=1e-6)


def test_rejects_bad_arguments() -> None:
    args = _case(1, [5], [1], 4, 2, 16, 4, torch.float32)
    with pytest.raises(ValueError):
        paged_attention(**{**args, "q": args["q"][:, :3]})  # H not a multiple of H_kv
    with pytest.raises(ValueError):
        paged_attention(**{**args, "cu_q": torch.tensor([0, 2])})  # cu_q must end at T


@pytest.mark.parametrize("backend", ALL)
@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize(("window", "softcap"), [(1, None), (5, None), (6, 1.5), (None, 2.0)])
def test_window_and_softcap_match_reference(backend: str, case: int, window: int | None,
                                            softcap: float | None) -> None:
    seq_lens, q_lens, heads, kv_heads, dim, block = CASES[case]
    args = _case(case, seq_lens, q_lens, heads, kv_heads, dim, block, torch.float32)
    want = paged_attention(**args, backend="reference", window=window, softcap=softcap)
    got = call(paged_attention, **args, backend=backend, window=window, softcap=softcap)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_reference_window_and_softcap_are_their_definition() -> None:
    """Row at position p sees keys p - window + 1 .. p; scores s = scale q.k become cap tanh(s / cap)."""
    seq_lens, q_lens, heads, kv_heads, dim, block, window, cap = [11, 6], [4, 6], 4, 2, 16, 4, 3, 0.7
    args = _case(9, seq_lens, q_lens, heads, kv_heads, dim, block, torch.float32)
    out = paged_attention(**args, backend="reference", scale=0.3, window=window, softcap=cap)
    flat_k = args["k_cache"].view(-1, kv_heads, dim)
    flat_v = args["v_cache"].view(-1, kv_heads, dim)
    for b, (n, t) in enumerate(zip(seq_lens, q_lens, strict=True)):
        pos = torch.arange(n)
        slots = args["block_table"][b, pos // block].long() * block + pos % block
        k = flat_k[slots].transpose(0, 1).repeat_interleave(heads // kv_heads, 0)  # [H, n, D]
        v = flat_v[slots].transpose(0, 1).repeat_interleave(heads // kv_heads, 0)
        q = args["q"][int(args["cu_q"][b]) : int(args["cu_q"][b + 1])].transpose(0, 1)  # [H, t, D]
        qpos = (n - t + torch.arange(t))[:, None]
        visible = (pos[None, :] <= qpos) & (pos[None, :] >= qpos - window + 1)
        s = cap * torch.tanh(0.3 * (q @ k.transpose(1, 2)) / cap)
        want = (s.masked_fill(~visible, float("-inf")).softmax(-1) @ v).transpose(0, 1)
        torch.testing.assert_close(out[int(args["cu_q"][b]) : int(args["cu_q"][b + 1])], want, rtol=1e-5, atol=1e-6)


def test_rejects_bad_window_and_softcap() -> None:
    args = _case(1, [5], [1], 4, 2, 16, 4, torch.float32)
    with pytest.raises(ValueError, match="window"):
        paged_attention(**args, window=0)
    with pytest.raises(ValueError, match="softcap"):
        paged_attention(**args, softcap=0.0)
