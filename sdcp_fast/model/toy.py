"""A deterministic toy language and drafters for it, for demos and tests that need no
checkpoint. The target is a fixed trigram-style table over a small English word list
(logits = A[previous] + B[the one before]); drafters are the same tables plus fixed noise,
so how often they agree with the target is set by the noise scale (a weak drafter drives
sessions down the escalation ladder)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from sdcp_fast.model.interfaces import Draft, Logits, ScoreRequest

WORDS = (
    "<eos> the a cache verifier drafter router commits proposes verifies token tokens round rounds "
    "fast slow model models small large accepts rejects every each one two many prefix digest chain "
    "epoch session and but then so of to in on with is are was . ,"
).split()
EOS = 0


def _bigram(seed: int, scale: float) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    table = torch.randn(len(WORDS), len(WORDS), generator=g) * scale  # [V, V]: row = previous token
    table[:, EOS] -= 4.0  # long enough sentences before <eos> becomes likely
    table -= 6.0 * torch.eye(len(WORDS))  # no word right after itself
    return table


def _pairs(context: Sequence[int], start: int) -> tuple[list[int], list[int]]:
    """The (previous, the one before) token of each row start..len(context); before the
    first token stands ``<eos>``."""
    if start < 1:
        raise ValueError(f"the first row needs a token before it (start = {start})")
    tail = [EOS, *context] if start == 1 else list(context[start - 2 :])
    return tail[1:], tail[:-1]


class ToyTarget:
    """TargetScorer over the toy bigram table (logits depend on the previous token only)."""

    vocab_size = len(WORDS)

    def __init__(self, seed: int = 7) -> None:
        self.table = _bigram(seed, 3.0)
        self.table2 = _bigram(seed + 1, 2.0)
        self.passes = 0

    def logits(self, context: Sequence[int], start: int) -> torch.Tensor:
        """Rows for positions start..len(context): the next-token logits after each prefix
        (``start >= 1``). Only the two tokens before each row count, so only the tail from
        ``start - 2`` is read, not the whole context."""
        return self._rows(*_pairs(context, start))

    def score(self, batch: Sequence[ScoreRequest]) -> Logits:
        """All the requests' rows in one gather and one add (``[sum(M + 1), V]``): a pass of
        16 rounds costs about what one request's rows did when each was a pass of its own."""
        self.passes += 1
        prev: list[int] = []
        before: list[int] = []
        counts: list[int] = []
        for req in batch:
            p, b = _pairs([*req.committed[-2:], *req.proposal], min(len(req.committed), 2))
            prev += p
            before += b
            counts.append(len(p))
        return Logits(self._rows(prev, before), counts)

    def _rows(self, prev: list[int], before: list[int]) -> torch.Tensor:
        index = torch.tensor([prev, before], dtype=torch.long)  # [2, R]
        return self.table[index[0]] + self.table2[index[1]]  # [R, V]

    def release(self, session: bytes) -> None:
        pass


class ToyDrafter:
    """Drafter whose logits are the target's plus fixed noise of the given scale."""

    def __init__(self, name: str, target: ToyTarget, noise: float, seed: int = 11) -> None:
        self.name = name
        self.target = target
        self.noise = _bigram(seed, noise)

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
        from sdcp_fast.kernels import apply_sampling_profile

        tokens: list[int] = []
        rows = []
        context = list(committed)
        for _ in range(m):
            logits = (self.target.logits(context, len(context)) + self.noise[context[-1]])  # [1, V]
            if rule == 1:
                tok = int(torch.argmax(logits, dim=-1))
            else:
                probs = apply_sampling_profile(logits, temperature_milli, top_k, top_p_milli)  # [1, V]
                tok = int(torch.multinomial(probs[0], 1, generator=generator))
                rows.append(probs[0])
            tokens.append(tok)
            context.append(tok)
        return Draft(tokens, torch.stack(rows) if rows else None)

    def release(self, session: bytes) -> None:
        pass


def encode(text: str) -> list[int]:
    index = {w: i for i, w in enumerate(WORDS)}
    return [index[w] for w in text.split() if w in index]


def decode(tokens: Sequence[int]) -> str:
    return " ".join(WORDS[t] for t in tokens if t != EOS).replace(" .", ".").replace(" ,", ",")
