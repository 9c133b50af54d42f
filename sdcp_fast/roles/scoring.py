"""One verification batch through the kernels: ragged proposals of many sessions, rule 1 and
rule 2 side by side, each session under its own sampling profile (§6.3 Scoring, §6.4)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate

import torch

from sdcp_fast import kernels
from sdcp_fast.protocol import Sampling, ScoreNeeded
from sdcp_fast.protocol.messages import RULE_GREEDY


@dataclass
class Scored:
    """A session's round in a batch: its work and, for rule 2, its draft rows ``[M, V]``."""

    work: ScoreNeeded
    q: torch.Tensor | None = None


def verify_batch(items: Sequence[Scored], logits: Sequence[torch.Tensor], *,
                 backend: str = "auto") -> list[tuple[int, int]]:
    """``(accepted, next token)`` for each item; ``logits[i]`` is ``[M_i + 1, V]``."""
    out: list[tuple[int, int]] = [(0, 0)] * len(items)
    greedy = [i for i, item in enumerate(items) if item.work.rule == RULE_GREEDY]
    sampled = [i for i, item in enumerate(items) if item.work.rule != RULE_GREEDY]
    if greedy:
        rows, tokens, cu = _ragged([items[i].work for i in greedy], [logits[i] for i in greedy])
        accepted, emitted = kernels.verify_greedy(rows, tokens, cu, backend=backend)
        for j, i in enumerate(greedy):
            a = int(accepted[j])
            out[i] = (a, int(emitted[j, a]))
    if sampled:
        works = [items[i].work for i in sampled]
        rows, tokens, cu = _ragged(works, [logits[i] for i in sampled])
        vocab, dev = rows.shape[1], rows.device
        # The kernels take q and the uniforms on the logits' device (the rows come from the MLC).
        q = torch.cat([items[i].q if items[i].q is not None else torch.zeros(0, vocab) for i in sampled]).to(dev)
        m_max = max(len(w.proposed) for w in works)
        uniforms = torch.zeros(len(works), m_max + 1, 2, dtype=torch.float64)
        for j, work in enumerate(works):
            u = work.uniforms
            assert u is not None
            uniforms[j, : len(u.accept), 0] = torch.tensor(u.accept, dtype=torch.float64)
            uniforms[j, : len(u.draw), 1] = torch.tensor(u.draw, dtype=torch.float64)
        uniforms = uniforms.to(dev)
        profile = [w.sampling or Sampling() for w in works]
        temperature = torch.tensor([1000 if s.temperature_milli is None else s.temperature_milli for s in profile])
        top_k = torch.tensor([s.top_k or 0 for s in profile])
        top_p = torch.tensor([s.top_p_milli or 0 for s in profile])
        accepted, emitted, bad = kernels.verify_speculative(
            rows, temperature, top_k, top_p, q, tokens, cu, uniforms, backend=backend)
        for j, i in enumerate(sampled):
            if bool(bad[j]):  # the core checked q(x) > 0 already; this would be a kernel bug
                raise RuntimeError("kernel flagged a proposal the core accepted")
            a = int(accepted[j])
            out[i] = (a, int(emitted[j, a]))
    return out


def _ragged(works: list[ScoreNeeded], logits: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    cu = torch.tensor([0, *accumulate(len(w.proposed) for w in works)], dtype=torch.int64)
    tokens = torch.tensor([t for w in works for t in w.proposed], dtype=torch.int64)
    return torch.cat(logits).float(), tokens, cu
