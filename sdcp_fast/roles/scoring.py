"""One verification batch through the kernels: ragged proposals of many sessions, rule 1 and
rule 2 side by side, each session under its own sampling profile (§6.3 Scoring, §6.4).

The pass's logits come as one ``[R, V]`` tensor, the rows of each round in batch order
(``M_i + 1`` each), and go to the kernels as they are: one kernel call per rule over the
whole batch, no per-session split and re-concatenation of vocabulary-wide rows. The results
stay on the logits' device until every rule's kernel has run: then one copy to the host
answers the whole batch (a read per session would wait on the device 2 x B times).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import TypeVar

import torch

from sdcp_fast import kernels
from sdcp_fast.model.interfaces import Logits
from sdcp_fast.protocol import Sampling, ScoreNeeded
from sdcp_fast.protocol.messages import RULE_GREEDY
from sdcp_fast.protocol.session import Uniforms

# The draft rows of a pass are gathered into one buffer kept per thread up to this size.
STAGING_BYTES = 512 << 20
_staging = threading.local()

# A rule's kernel results: accepted [B], emitted [B, M_max + 1] and, for rule 2, bad [B].
Outcome = tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]


@dataclass
class Scored:
    """A session's round in a batch: its work and, for rule 2, its draft rows ``[M, V]`` and
    the uniforms ``provide_q`` returned (None: the work's own, known when it was handed out)."""

    work: ScoreNeeded
    q: torch.Tensor | None = None
    uniforms: Uniforms | None = None


S = TypeVar("S", bound=Scored)


def verify_batch(items: Sequence[S], logits: torch.Tensor | Sequence[torch.Tensor], *,
                 backend: str = "auto", moved: Callable[[S], bool] | None = None) -> list[tuple[int, int] | None]:
    """``(accepted, next token)`` for each item; None for an item the kernel flagged whose rows
    ``moved`` says changed while the kernel read them (rows read in place, rewritten by their
    writer meanwhile: the caller answers that round alone, the others of the pass stand).

    ``logits`` is what :meth:`~sdcp_fast.model.interfaces.TargetScorer.score` returned for
    the items' requests: one ``[R, V]`` tensor whose first ``sum(M_i + 1)`` rows are the
    items' in order, or one ``[M_i + 1, V]`` tensor per item. Rows or tensors after the
    items' (requests of the pass that are not rounds, e.g. prefill chunks) are ignored."""
    if not items:
        return []
    counts = [len(item.work.proposed) + 1 for item in items]
    cu_rows = [0, *accumulate(counts)]
    if isinstance(logits, torch.Tensor):
        flat = logits
    elif isinstance(logits, Logits):  # views of one tensor: read that tensor
        flat = logits.rows
    else:  # a scorer that answers per request: one copy into the layout the kernels read
        flat = torch.cat(list(logits[: len(items)]))
    if flat.shape[0] < cu_rows[-1]:
        raise ValueError(f"the pass returned {flat.shape[0]} logit rows for {cu_rows[-1]}")
    greedy = [i for i, item in enumerate(items) if item.work.rule == RULE_GREEDY]
    sampled = [i for i, item in enumerate(items) if item.work.rule != RULE_GREEDY]
    parts: list[Outcome] = []
    if greedy:
        parts.append(_greedy([items[i] for i in greedy], _rows(flat, greedy, cu_rows, len(items)), backend))
    if sampled:
        parts.append(_sampled([items[i] for i in sampled], _rows(flat, sampled, cu_rows, len(items)), backend))
    out: list[tuple[int, int] | None] = [(0, 0)] * len(items)
    for i, (accepted, token, bad) in zip([*greedy, *sampled], _on_host(parts), strict=True):
        if bad:  # the core checked q(x) > 0 already: a kernel bug, unless the rows changed since
            if moved is not None and moved(items[i]):
                out[i] = None
                continue
            raise RuntimeError("kernel flagged a proposal the core accepted")
        out[i] = (accepted, token)
    return out


def _on_host(parts: list[Outcome]) -> list[tuple[int, int, int]]:
    """``(accepted a_b, emitted[b, a_b], bad)`` of each rule's sessions in turn, from one
    read of one tensor (the rules' results side by side, flat): a device is waited on once,
    and a small batch on the host costs one torch op, not one per member."""
    values: list[int] = torch.cat([t.reshape(-1) for part in parts for t in part if t is not None]).tolist()
    rows: list[tuple[int, int, int]] = []
    at = 0
    for _, emitted, bad in parts:
        batch, width = emitted.shape
        firsts, at = values[at : at + batch], at + batch
        emits, at = values[at : at + batch * width], at + batch * width
        flags = [0] * batch if bad is None else values[at : at + batch]
        at += 0 if bad is None else batch
        rows += [(a, emits[b * width + max(a, 0)], flag) for b, (a, flag) in enumerate(zip(firsts, flags, strict=True))]
    return rows


def _rows(flat: torch.Tensor, chosen: list[int], cu_rows: list[int], batch: int) -> torch.Tensor:
    """The logit rows of the ``chosen`` items: a view when they are all of them (one rule),
    else one gather of just their rows."""
    if len(chosen) == batch:
        rows = flat if flat.shape[0] == cu_rows[-1] else flat[: cu_rows[-1]]
    else:
        index = [r for i in chosen for r in range(cu_rows[i], cu_rows[i + 1])]
        rows = flat.index_select(0, torch.tensor(index, dtype=torch.int64, device=flat.device))
    return rows if rows.dtype in (torch.float32, torch.bfloat16) else rows.float()


def _greedy(items: list[Scored], rows: torch.Tensor, backend: str) -> Outcome:
    tokens, cu = _layout([item.work for item in items])
    accepted, emitted = kernels.verify_greedy(rows, tokens, cu, backend=backend)
    return accepted, emitted, None


def _sampled(items: list[Scored], rows: torch.Tensor, backend: str) -> Outcome:
    works = [item.work for item in items]
    tokens, cu = _layout(works)
    vocab, dev = rows.shape[1], rows.device
    # The kernels take q and the uniforms on the logits' device (the rows come from the MLC). On
    # the host, each round's rows as they are (mapped in place from shared memory, most often):
    # gathering them copied 512 KB a round (V = 32,000, M = 4).
    q: torch.Tensor | list[torch.Tensor]
    if dev.type == "cpu" and all(item.q is not None for item in items):
        q = [item.q for item in items if item.q is not None]
    else:
        q = _draft_rows(items, vocab).to(dev)
    width = max(len(w.proposed) for w in works) + 1
    # [B, M_max + 1, 2], zero-padded, built from one flat list: a nested list of pairs took
    # twice as long to become a tensor.
    flat = [0.0] * (len(works) * width * 2)
    for b, item in enumerate(items):
        u = item.uniforms or item.work.uniforms
        assert u is not None
        at = 2 * width * b
        flat[at : at + 2 * len(u.accept) : 2] = u.accept
        flat[at + 1 : at + 1 + 2 * len(u.draw) : 2] = u.draw
    uniforms = torch.tensor(flat, dtype=torch.float64).view(len(works), width, 2)
    profile = [w.sampling or Sampling() for w in works]
    temperature = torch.tensor([1000 if s.temperature_milli is None else s.temperature_milli for s in profile])
    top_k = torch.tensor([s.top_k or 0 for s in profile])
    top_p = torch.tensor([s.top_p_milli or 0 for s in profile])
    accepted, emitted, bad = kernels.verify_speculative(
        rows, temperature, top_k, top_p, q, tokens, cu, uniforms.to(dev), backend=backend)
    return accepted, emitted, bad


def _draft_rows(items: list[Scored], vocab: int) -> torch.Tensor:
    """The items' draft rows as one ``[D, V]`` float32 tensor (for a device), copied into a buffer this
    thread keeps from pass to pass (up to ``STAGING_BYTES``): a fresh tensor of that size
    (128 MB for 256 rounds of M = 4 at V = 32,000) is new memory that the copy faults in page
    by page on every pass, which took ~6x the copy itself (docs/measurements.md, "Rule 2: the
    q rows")."""
    parts = [item.q if item.q is not None else torch.zeros(0, vocab) for item in items]
    rows = sum(int(p.shape[0]) for p in parts)
    if rows * vocab * 4 > STAGING_BYTES or any(p.dtype != torch.float32 for p in parts):
        return torch.cat(parts)
    held = getattr(_staging, "q", None)
    if held is None or held.shape[1] != vocab or held.shape[0] < rows:
        held = _staging.q = torch.empty(rows, vocab, dtype=torch.float32)
    out = held[:rows]
    torch.cat(parts, out=out)
    return out


def _layout(works: list[ScoreNeeded]) -> tuple[torch.Tensor, torch.Tensor]:
    """The proposed tokens ``[D]`` and their offsets ``[B + 1]``, built on the host as views
    of one tensor."""
    cu = [0, *accumulate(len(w.proposed) for w in works)]
    both = torch.tensor(cu + [t for w in works for t in w.proposed], dtype=torch.int64)
    return both[len(cu):], both[: len(cu)]
