"""A deterministic toy language and drafters for it, for demos and tests that need no
checkpoint. The target is a fixed trigram-style table over a small English word list
(logits = A[previous] + B[the one before]); drafters are the same tables plus fixed noise,
so how often they agree with the target is set by the noise scale (a weak drafter drives
sessions down the escalation ladder)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from sdcp_fast.model.interfaces import Draft, ScoreRequest

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


class ToyTarget:
    """TargetScorer over the toy bigram table (logits depend on the previous token only)."""

    vocab_size = len(WORDS)

    def __init__(self, seed: int = 7) -> None:
        self.table = _bigram(seed, 3.0)
        self.table2 = _bigram(seed + 1, 2.0)
        self.passes = 0

    def logits(self, context: Sequence[int], start: int) -> torch.Tensor:
        """Rows for positions start..len(context): the next-token logits after each prefix."""
        ctx = torch.tensor([EOS, *context], dtype=torch.long)  # padded so the first token has a "before"
        prev = ctx[start : len(context) + 1]  # [R]
        before = ctx[start - 1 : len(context)]  # [R]
        return self.table[prev] + self.table2[before]  # [R, V]

    def score(self, batch: Sequence[ScoreRequest]) -> list[torch.Tensor]:
        self.passes += 1
        out = []
        for req in batch:
            context = [*req.committed, *req.proposal]
            out.append(self.logits(context, len(req.committed)).float())  # [M+1, V]
        return out

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
