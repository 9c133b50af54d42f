"""Input families shared by the kernel tests: random, tied, one-hot and ragged batches."""

from __future__ import annotations

import torch


def logits(gen: torch.Generator, rows: int, vocab: int, kind: str = "random") -> torch.Tensor:
    """float32 logits: "random" (spread like a model's), "ties" (few distinct values, many
    exact ties), "onehot" (one finite entry per row, the rest -inf)."""
    if kind == "random":
        return torch.randn(rows, vocab, generator=gen) * 3.0
    if kind == "ties":
        return torch.randint(0, 3, (rows, vocab), generator=gen).to(torch.float32)
    if kind == "onehot":
        out = torch.full((rows, vocab), float("-inf"))
        out[torch.arange(rows), torch.randint(0, vocab, (rows,), generator=gen)] = 0.0
        return out
    raise ValueError(kind)


def ragged(ms: list[int]) -> torch.Tensor:
    cu = [0]
    for m in ms:
        cu.append(cu[-1] + m)
    return torch.tensor(cu, dtype=torch.int64)


def draft(gen: torch.Generator, p: torch.Tensor, ms: list[int], closeness: str) -> tuple[torch.Tensor, torch.Tensor]:
    """q rows and tokens sampled from them for each proposed position of a ragged batch.

    p: ``[D + B, V]`` target probabilities (row layout of verify_*); closeness is "close"
    (q a perturbation of p), "far" (independent) or "disjoint" (q has no mass where p is
    largest).
    """
    rows = []
    for b, m in enumerate(ms):
        start = sum(ms[:b]) + b
        rows.append(p[start : start + m])
    target = torch.cat(rows) if rows else p[:0]
    vocab = p.shape[1]
    if closeness == "close":
        q = torch.softmax(torch.log(target + 1e-12) + 0.3 * torch.randn(target.shape, generator=gen), dim=1)
    elif closeness == "far":
        q = torch.softmax(torch.randn(target.shape, generator=gen) * 2.0, dim=1)
    elif closeness == "disjoint":
        top = target.argsort(dim=1, descending=True)[:, : max(1, vocab // 2)]
        q = torch.softmax(torch.randn(target.shape, generator=gen), dim=1).scatter(1, top, 0.0)
        q = q / q.sum(dim=1, keepdim=True)
    else:
        raise ValueError(closeness)
    q = q.to(torch.float32)
    tokens = torch.multinomial(q.double(), 1, generator=gen).squeeze(1) if q.shape[0] else torch.zeros(0, dtype=torch.int64)
    return q, tokens
