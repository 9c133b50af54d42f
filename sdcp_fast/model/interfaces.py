"""What a verifier needs from a target model and a drafter role from a draft model.

Both are keyed by session and handed the *whole committed token list* (prompt followed by
committed output) on every call. Implementations keep whatever cache they like (paged KV,
n-gram tables) and reconcile it against that list: reuse the longest prefix they still
hold, drop the rest (no copy), compute what is missing. This keeps them correct across
rejected positions, retries and fail-over without extra protocol in between.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch


@dataclass(frozen=True)
class ScoreRequest:
    session: bytes
    committed: Sequence[int]  # prompt + committed output, len >= 1
    proposal: Sequence[int]  # M >= 0 proposed tokens


class TargetScorer(Protocol):
    """The verifier's model."""

    vocab_size: int

    def score(self, batch: Sequence[ScoreRequest]) -> list[torch.Tensor]:
        """One batched pass. For each request, logits ``[M + 1, V]`` float32: row i is the
        target's next-token logits after ``committed + proposal[:i]``."""
        ...

    def release(self, session: bytes) -> None:
        """Forget the session's cached state."""
        ...


@dataclass(frozen=True)
class Draft:
    tokens: list[int]  # M proposed tokens
    q_rows: torch.Tensor | None  # [M, V] float32: the distribution each token was sampled from


class Drafter(Protocol):
    """Proposes M tokens. For rule 2 it samples each token from exactly the row it returns
    (§5.2), after applying the session's sampling profile to its own logits."""

    name: str

    def propose(
        self,
        session: bytes,
        committed: Sequence[int],
        m: int,
        *,
        rule: int,
        temperature_milli: int | None = None,
        top_k: int | None = None,
        top_p_milli: int | None = None,
        generator: torch.Generator | None = None,
    ) -> Draft:
        ...

    def release(self, session: bytes) -> None:
        ...
