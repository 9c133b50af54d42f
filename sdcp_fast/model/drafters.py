"""Drafters (``sdcp_fast.model.interfaces.Drafter``): a separate draft model, the
target's own first layers (self-speculative layer skipping), and n-gram prompt lookup.

Each one reconciles its state against the whole committed list it is handed. For rule 2
the model drafters apply the session's sampling profile to their own logits and sample
each token from exactly the row they return (§5.2); rule 1 drafts greedily and returns
no rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from sdcp_fast.kernels import apply_sampling_profile, sample_from_probs
from sdcp_fast.model.interfaces import Draft

from .llama import Transformer
from .target_scorer import ModelRunner, greedy_token


def _check(committed: Sequence[int], m: int, rule: int) -> None:
    if m < 1:
        raise ValueError("m must be >= 1")
    if not committed:
        raise ValueError("committed must hold at least one token")
    if rule not in (1, 2):
        raise ValueError(f"rule {rule} is not registered")


class ModelDrafter:
    """Autoregressive drafting with a model of its own or the target's first ``n_layers``
    layers (weights shared with the target, KV cache separate)."""

    def __init__(self, model: Transformer, *, n_layers: int | None = None, name: str | None = None,
                 **runner_kw: int) -> None:
        self.runner = ModelRunner(model, n_layers=n_layers, **runner_kw)  # type: ignore[arg-type]
        self.vocab_size = model.cfg.vocab_size
        self.name = name or (f"layerskip:{n_layers}" if n_layers else "model")

    def propose(self, session: bytes, committed: Sequence[int], m: int, *, rule: int,
                temperature_milli: int | None = None, top_k: int | None = None, top_p_milli: int | None = None,
                generator: torch.Generator | None = None) -> Draft:
        _check(committed, m, rule)
        ctx = list(committed)
        tokens: list[int] = []
        rows: list[torch.Tensor] = []
        for _ in range(m):
            logits = self.runner.decode_one([(session, ctx)])  # [1, V]
            if rule == 1:
                tok = greedy_token(logits[0])
            else:
                probs = apply_sampling_profile(logits, temperature_milli, top_k, top_p_milli)  # [1, V]
                # Drawn on the host generator whatever the device: a seeded draft repeats on either.
                u = torch.rand(1, generator=generator, dtype=torch.float64).to(probs.device)
                tok = int(sample_from_probs(probs, u)[0])
                rows.append(probs[0])
            tokens.append(tok)
            ctx.append(tok)
        # The rows travel through the MLC as bytes: on the host.
        return Draft(tokens, torch.stack(rows).cpu() if rows else None)

    def release(self, session: bytes) -> None:
        self.runner.release(session)


@dataclass
class _NgramIndex:
    tokens: list[int] = field(default_factory=list)
    # n-gram -> the latest end e (exclusive) at which it occurs with a token after it (e < len).
    last_end: dict[tuple[int, ...], int] = field(default_factory=dict)


class NgramDrafter:
    """Prompt lookup (as vLLM's ngram speculator): find the latest earlier occurrence of
    the longest suffix of ``n_max``..``n_min`` tokens and propose what followed it. Its q
    rows are one-hot: the proposal is deterministic."""

    def __init__(self, vocab_size: int, *, n_min: int = 1, n_max: int = 4) -> None:
        if not 1 <= n_min <= n_max:
            raise ValueError("need 1 <= n_min <= n_max")
        self.vocab_size, self.n_min, self.n_max = vocab_size, n_min, n_max
        self.name = "ngram"
        self._index: dict[bytes, _NgramIndex] = {}

    def _sync(self, session: bytes, committed: Sequence[int]) -> _NgramIndex:
        idx = self._index.get(session)
        held = len(idx.tokens) if idx else 0
        if idx is None or held > len(committed) or list(committed[:held]) != idx.tokens:
            idx = self._index[session] = _NgramIndex()
        # Record n-grams ending before each new position that now has a successor.
        for e in range(max(1, len(idx.tokens)), len(committed)):
            for n in range(self.n_min, min(self.n_max, e) + 1):
                idx.last_end[tuple(committed[e - n:e])] = e
        idx.tokens = list(committed)
        return idx

    def propose(self, session: bytes, committed: Sequence[int], m: int, *, rule: int,
                temperature_milli: int | None = None, top_k: int | None = None, top_p_milli: int | None = None,
                generator: torch.Generator | None = None) -> Draft:
        _check(committed, m, rule)
        idx = self._sync(session, committed)
        c = idx.tokens
        tokens: list[int] = []
        for n in range(min(self.n_max, len(c)), self.n_min - 1, -1):
            e = idx.last_end.get(tuple(c[len(c) - n:]))
            if e is not None:
                tokens = c[e:e + m]
                break
        if not tokens:  # no match: one cheap guess, so the round still verifies (M >= 1)
            tokens = [c[-1]]
        q = None
        if rule == 2:
            q = torch.zeros((len(tokens), self.vocab_size), dtype=torch.float32)
            q[torch.arange(len(tokens)), torch.tensor(tokens)] = 1.0
        return Draft(tokens, q)

    def release(self, session: bytes) -> None:
        self._index.pop(session, None)
