"""Rule-2 statistics: the drafter kinds, the statistics, and biased samplers they must reject.

A kind is one pair of rows (p at position 1, q the draft row) plus the row p2 at position 2,
on a 5-token vocabulary built from three groups of tokens: tokens where p > q (the correct
residual max(p - q, 0) lives there), tokens where p is just below q (the residual is 0 there,
but ``max(p - 0.9q, 0)`` is not), and tokens where p = 0 < q (``|p - q|`` puts mass there).
That is what lets 7,000-12,000 sessions tell the residual from each biased one; random rows
of a large vocabulary cannot (the audit found ``|p - q|`` passing a chi-squared test at V=1000).

Every statistic here states its false-rejection probability; ``tests/kernels/test_verify_statistics.py``
asserts both that the kernels pass and that each biased sampler fails.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

# Per statistic and per position: the probability that an exact sampler fails it.
ALPHA = 1e-5


@dataclass(frozen=True)
class Kind:
    """One drafter kind: target rows as float32 logits (-inf where p = 0), a float32 draft row."""

    name: str
    p1: tuple[float, ...]
    q1: tuple[float, ...]
    p2: tuple[float, ...]
    # Sessions to draw: enough for every statistic of failures() to reject each biased
    # residual with probability >= 1 - ALPHA (test_sample_size_gives_the_power checks it).
    sessions: int

    @property
    def logits(self) -> torch.Tensor:  # [2, V]
        return torch.tensor([self.p1, self.p2], dtype=torch.float64).log().to(torch.float32)

    @property
    def q(self) -> torch.Tensor:  # [1, V]
        return torch.tensor([self.q1], dtype=torch.float32)

    @property
    def p(self) -> torch.Tensor:
        """p of both rows as the kernels compute it (softmax of the float32 logits), float64 ``[2, V]``."""
        return torch.softmax(self.logits.double(), dim=1)


# beta = sum(max(p - q, 0)) is the rejection probability at position 1.
KINDS = {
    # beta 0.18: q a small perturbation of p (most drafts accepted)
    "close": Kind("close", (0.33, 0.32, 0.18, 0.17, 0.0), (0.333, 0.323, 0.0, 0.172, 0.172),
                  (0.1, 0.2, 0.3, 0.4, 0.0), 7000),
    # beta 0.40: q never proposes p's second token and puts 40% of its mass where p is 0
    "far": Kind("far", (0.60, 0.40, 0.0, 0.0, 0.0), (0.605, 0.0, 0.245, 0.15, 0.0),
                (0.25, 0.25, 0.25, 0.0, 0.25), 12000),
    # beta 0.40: q has no mass on p's most likely token and 40% of it where p is 0
    "disjoint": Kind("disjoint", (0.40, 0.35, 0.25, 0.0, 0.0), (0.0, 0.351, 0.2508, 0.22, 0.1782),
                     (0.0, 0.0, 0.5, 0.5, 0.0), 11500),
}

Residual = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def exact_residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    return torch.clamp(p - q, min=0.0)


# The biased residuals a statistic must reject (STYLE.md, "Statistical tests for sampling").
MUTANTS: dict[str, Residual] = {
    "p": lambda p, q: p,
    "|p - q|": lambda p, q: (p - q).abs(),
    "max(p - 0.9q, 0)": lambda p, q: torch.clamp(p - 0.9 * q, min=0.0),
}


def normalized_residual(kind: Kind, residual: Residual = exact_residual) -> torch.Tensor:
    p, q = kind.p[0], kind.q[0].double()
    r = residual(p, q)
    return r / r.sum() if float(r.sum()) > 0 else p


def emitted_distribution(kind: Kind, residual: Residual = exact_residual) -> torch.Tensor:
    """Distribution of the token emitted at position 1: min(p, q) + beta * residual / |residual|."""
    p, q = kind.p[0], kind.q[0].double()
    overlap = torch.minimum(p, q)
    return overlap + (1.0 - overlap.sum()) * normalized_residual(kind, residual)


def draws(kind: Kind, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """n sessions of one proposed token: draft tokens sampled from q, and uniforms ``[n, 2, 2]``."""
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.multinomial(kind.q[0].double(), n, replacement=True, generator=gen)
    return tokens, torch.rand(n, 2, 2, generator=gen, dtype=torch.float64)


def biased_verify(kind: Kind, tokens: torch.Tensor, u: torch.Tensor,
                  residual: Residual = exact_residual) -> tuple[torch.Tensor, torch.Tensor]:
    """Rule 2 for one-token proposals on ``kind``'s rows, with the residual replaced: the sampler
    the statistics must reject (and, with the exact residual, one they must accept)."""
    p, q = kind.p, kind.q[0].double()
    accept = u[:, 0, 0] < torch.clamp(p[0, tokens] / q[tokens], max=1.0)
    rejected = torch.searchsorted(torch.cumsum(normalized_residual(kind, residual), 0),
                                  u[:, 0, 1].contiguous(), right=True)
    final = torch.searchsorted(torch.cumsum(p[1], 0), u[:, 1, 1].contiguous(), right=True)
    first = torch.where(accept, tokens, rejected)
    emitted = torch.stack([first, torch.where(accept, final, -1)], dim=1)
    return accept.to(torch.int32), emitted.to(torch.int32)


# -- statistics -----------------------------------------------------------------------------

def chi2_pvalue(samples: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson chi-squared p-value of samples (token ids) against probs; bins with expected
    count < 5 are merged into one. A token of probability 0 in the sample gives 0."""
    n = samples.numel()
    observed = torch.bincount(samples.long(), minlength=probs.numel()).double()
    if float(observed[probs <= 0].sum()) > 0:
        return 0.0
    expected = probs.double() * n
    small = (expected < 5) & (probs > 0)
    big = expected >= 5
    obs = torch.cat([observed[big], observed[small].sum().reshape(1)])
    exp = torch.cat([expected[big], expected[small].sum().reshape(1)])
    keep = exp > 0
    obs, exp = obs[keep], exp[keep]
    df = obs.numel() - 1
    if df < 1:
        return 1.0
    stat = ((obs - exp) ** 2 / exp).sum()
    return float(torch.special.gammaincc(torch.tensor(df / 2.0, dtype=torch.float64), stat / 2.0))


def tv_bound(probs: torch.Tensor, n: int, alpha: float = ALPHA) -> float:
    """TV distance an exact sample of size n exceeds with probability <= alpha.

    E[TV] <= 0.5 * sum sqrt(p (1 - p) / n) (Jensen), and TV moves by at most 1/n when one
    sample changes, so P(TV > E[TV] + t) <= exp(-2 n t^2) (McDiarmid).
    """
    mean = 0.5 * float(torch.sqrt(probs * (1 - probs) / n).sum())
    return mean + math.sqrt(math.log(1 / alpha) / (2 * n))


def total_variation(samples: torch.Tensor, probs: torch.Tensor) -> float:
    freq = torch.bincount(samples.long(), minlength=probs.numel()).double() / samples.numel()
    return 0.5 * float((freq - probs).abs().sum())


def rate_bound(n: int, alpha: float = ALPHA) -> float:
    """|mean - expectation| a mean of n Bernoulli trials exceeds with probability <= alpha (Hoeffding)."""
    return math.sqrt(math.log(2 / alpha) / (2 * n))


def failures(kind: Kind, accepted: torch.Tensor, emitted: torch.Tensor) -> list[str]:
    """Every statistic a sample (one-token proposals on ``kind``) fails; [] for an exact sampler
    with probability >= 1 - 5 * ALPHA.

    Total variation is taken where the residual acts, on the tokens drawn at a rejection: at
    the same power, TV of all emitted tokens against p would need about twice the sessions
    (a biased residual moves at most beta x its own TV there)."""
    p = kind.p
    out = []
    first = emitted[:, 0]
    if chi2_pvalue(first, p[0]) < ALPHA:
        out.append("chi2(position 1, p)")
    # Given a rejection, the token is drawn from the normalized residual alone.
    drawn, residual = first[accepted == 0], normalized_residual(kind)
    if chi2_pvalue(drawn, residual) < ALPHA:
        out.append("chi2(position 1 | rejected, residual)")
    tv, bound = total_variation(drawn, residual), tv_bound(residual, drawn.numel())
    if tv > bound:
        out.append(f"TV(position 1 | rejected, residual) {tv:.4f} > {bound:.4f}")
    if chi2_pvalue(emitted[accepted == 1, 1], p[1]) < ALPHA:
        out.append("chi2(position 2 | accepted, p2)")
    alpha = float(torch.minimum(p[0], kind.q[0].double()).sum())
    rate = float(accepted.double().mean())
    if abs(rate - alpha) > rate_bound(accepted.numel()):
        out.append(f"acceptance {rate:.4f} vs sum(min(p, q)) {alpha:.4f}")
    return out


# -- the stratified check (deterministic, cheap enough for the triton interpreter) ------------

# Grid sizes: 24 points tell each biased residual from the exact one with certainty here
# (test_sample_size_gives_the_power); the final draw only checks the CDF walk.
GRID = 24
GRID_FINAL = 12


def _grid(n: int) -> torch.Tensor:
    return (torch.arange(n, dtype=torch.float64) + 0.5) / n


def grid_inputs(kind: Kind) -> tuple[torch.Tensor, torch.Tensor, dict[str, slice]]:
    """Sessions that walk each draw over a grid of uniforms (k + 0.5) / n: "residual" (a token
    with p = 0 < q, so always rejected; u[., 0, 1] on a grid of GRID) and "final" (a token with
    p > 0 and u[., 0, 0] = 0, so always accepted; u[., 1, 1] on a grid of GRID_FINAL). Unused
    uniforms are 0.5. (Acceptance between those extremes is left to the sampled statistics
    and to the parity tests: every draft token here has p/q near 0, near 1 or above 1.)"""
    p, q = kind.p[0], kind.q[0].double()
    zero_p = int(torch.nonzero((p == 0) & (q > 0))[0])
    sure = int(torch.argmax(torch.where(q > 0, p / q, 0.0)))
    tokens = torch.tensor([zero_p] * GRID + [sure] * GRID_FINAL)
    u = torch.full((GRID + GRID_FINAL, 2, 2), 0.5, dtype=torch.float64)
    u[:GRID, 0, 1] = _grid(GRID)
    u[GRID:, 0, 0] = 0.0
    u[GRID:, 1, 1] = _grid(GRID_FINAL)
    return tokens, u, {"residual": slice(0, GRID), "final": slice(GRID, GRID + GRID_FINAL)}


def grid_failures(kind: Kind, tokens: torch.Tensor, accepted: torch.Tensor, emitted: torch.Tensor) -> list[str]:
    """What differs from the rule on grid_inputs: over a grid of n uniforms, an exact inverse
    CDF gives each token a count within 1 of n x its probability (no grid point splits a CDF
    step: grid_is_clear checks it)."""
    _, _, parts = grid_inputs(kind)
    out = []
    for name, col, probs in (("residual", 0, normalized_residual(kind)), ("final", 1, kind.p[1])):
        sel = parts[name]
        n = sel.stop - sel.start
        if not bool((accepted[sel] == col).all()):
            out.append(f"{name}: accepted {accepted[sel].tolist()}")
            continue
        counts = torch.bincount(emitted[sel, col].long().clamp(min=0), minlength=probs.numel()).double()
        if bool((emitted[sel, col] < 0).any()) or bool(((counts - n * probs).abs() >= 1).any()):
            out.append(f"{name}: counts {counts.tolist()} vs {(n * probs).tolist()}")
    return out


def grid_is_clear(kind: Kind, tol: float = 1e-6) -> bool:
    """No grid point lies within tol of a CDF step of the residual or of p2."""
    return all(float((_grid(n).unsqueeze(1) - torch.cumsum(probs, 0).unsqueeze(0)).abs().min()) > tol
               for n, probs in ((GRID, normalized_residual(kind)), (GRID_FINAL, kind.p[1])))
