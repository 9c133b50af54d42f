"""One verification batch through the kernels: ragged proposals of many sessions, rule 1 and
rule 2 side by side, each session under its own sampling profile (§6.3 Scoring, §6.4).

The results stay on the logits' device until every rule's kernel has run: then one copy to
the host answers the whole batch (a read per session would wait on the device 2 x B times).
"""

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
    greedy = [i for i, item in enumerate(items) if item.work.rule == RULE_GREEDY]
    sampled = [i for i, item in enumerate(items) if item.work.rule != RULE_GREEDY]
    parts: list[torch.Tensor] = []  # [B_rule, 3]: accepted, next token, bad
    if greedy:
        parts.append(_greedy([items[i] for i in greedy], [logits[i] for i in greedy], backend))
    if sampled:
        parts.append(_sampled([items[i] for i in sampled], [logits[i] for i in sampled], backend))
    if not parts:
        return []
    rows: list[list[int]] = torch.cat([p.to(parts[0].device) for p in parts]).tolist()  # the one sync
    out: list[tuple[int, int]] = [(0, 0)] * len(items)
    for i, (accepted, token, bad) in zip([*greedy, *sampled], rows, strict=True):
        if bad:  # the core checked q(x) > 0 already; this would be a kernel bug
            raise RuntimeError("kernel flagged a proposal the core accepted")
        out[i] = (accepted, token)
    return out


def _results(accepted: torch.Tensor, emitted: torch.Tensor, bad: torch.Tensor | None) -> torch.Tensor:
    """``[B, 3]`` int64 on the kernels' device: accepted a_b, emitted[b, a_b], bad."""
    a = accepted.long()
    token = emitted.long().gather(1, a.clamp(min=0).unsqueeze(1)).squeeze(1)
    flag = torch.zeros_like(a) if bad is None else bad.long()
    return torch.stack([a, token, flag], dim=1)


def _greedy(items: list[Scored], logits: list[torch.Tensor], backend: str) -> torch.Tensor:
    rows, tokens, cu = _ragged([item.work for item in items], logits)
    accepted, emitted = kernels.verify_greedy(rows, tokens, cu, backend=backend)
    return _results(accepted, emitted, None)


def _sampled(items: list[Scored], logits: list[torch.Tensor], backend: str) -> torch.Tensor:
    works = [item.work for item in items]
    rows, tokens, cu = _ragged(works, logits)
    vocab, dev = rows.shape[1], rows.device
    # The kernels take q and the uniforms on the logits' device (the rows come from the MLC).
    q = torch.cat([item.q if item.q is not None else torch.zeros(0, vocab) for item in items]).to(dev)
    m_max = max(len(w.proposed) for w in works)
    uniforms = torch.zeros(len(works), m_max + 1, 2, dtype=torch.float64)
    for j, work in enumerate(works):
        u = work.uniforms
        assert u is not None
        uniforms[j, : len(u.accept), 0] = torch.tensor(u.accept, dtype=torch.float64)
        uniforms[j, : len(u.draw), 1] = torch.tensor(u.draw, dtype=torch.float64)
    profile = [w.sampling or Sampling() for w in works]
    temperature = torch.tensor([1000 if s.temperature_milli is None else s.temperature_milli for s in profile])
    top_k = torch.tensor([s.top_k or 0 for s in profile])
    top_p = torch.tensor([s.top_p_milli or 0 for s in profile])
    accepted, emitted, bad = kernels.verify_speculative(
        rows, temperature, top_k, top_p, q, tokens, cu, uniforms.to(dev), backend=backend)
    return _results(accepted, emitted, bad)


def _ragged(works: list[ScoreNeeded], logits: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    cu = torch.tensor([0, *accumulate(len(w.proposed) for w in works)], dtype=torch.int64)
    tokens = torch.tensor([t for w in works for t in w.proposed], dtype=torch.int64)
    return torch.cat(logits).float(), tokens, cu
