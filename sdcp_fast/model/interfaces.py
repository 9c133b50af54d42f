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

    def score(self, batch: Sequence[ScoreRequest]) -> torch.Tensor | list[torch.Tensor]:
        """One batched pass: for each request, logits ``[M + 1, V]`` float32, row i the
        target's next-token logits after ``committed + proposal[:i]``. Either all of them as
        one ``[sum(M + 1), V]`` tensor, each request's rows in batch order (what the verifier's
        kernels read, so a pass need not split its head's output), or one tensor per request.
        :func:`per_request` gives the per-request view of either."""
        ...

    def release(self, session: bytes) -> None:
        """Forget the session's cached state."""
        ...


class Logits(list[torch.Tensor]):
    """Per-request logits that are views of one ``[R, V]`` tensor, :attr:`rows` (each
    request's rows in batch order): used as the list, while the verifier's kernels read
    ``rows`` itself instead of concatenating the views again."""

    def __init__(self, rows: torch.Tensor, counts: Sequence[int]) -> None:
        super().__init__(rows.split(list(counts)))
        self.rows = rows


def per_request(logits: torch.Tensor | Sequence[torch.Tensor],
                batch: Sequence[ScoreRequest]) -> list[torch.Tensor]:
    """:meth:`TargetScorer.score`'s answer as one ``[M + 1, V]`` tensor per request (views)."""
    if isinstance(logits, torch.Tensor):
        return list(logits.split([len(r.proposal) + 1 for r in batch]))
    return list(logits)


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


class TargetKV(Protocol):
    """Optional, beside a :class:`TargetScorer` that keeps a KV cache: its committed state as
    bytes another verifier can import (§6.3 "MAY publish the target KV cache", §6.9
    ``resume.target_kv``). ``export_kv`` and ``import_kv`` touch the cache, so the caller runs
    them where it runs ``score`` (never concurrently with a pass); ``encode_kv`` and
    ``decode_kv`` work on a private copy and may run anywhere."""

    def export_kv(self, session: bytes, committed: Sequence[int]) -> object | None:
        """A copy of the cached positions holding ``committed``'s longest prefix (None: none)."""
        ...

    def encode_kv(self, pages: object) -> bytes | memoryview:
        ...

    def decode_kv(self, data: object) -> object:
        """Parsed pages; ``ValueError`` when they are another model's or malformed."""
        ...

    def import_kv(self, session: bytes, pages: object, committed: Sequence[int]) -> int:
        """Install the pages as the session's cached prefix (``ValueError`` when their tokens
        disagree with ``committed``); how many positions the next pass need not compute."""
        ...
