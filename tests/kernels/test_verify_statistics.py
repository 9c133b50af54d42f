"""Rule 2 statistics: the emitted tokens follow p whatever q is, a rejected position draws from
the normalized residual max(p - q, 0), and the acceptance rate is sum(min(p, q)).

The rows, the statistics and the biased samplers are in stat_support.py. Each statistic fails
an exact sampler with probability <= ALPHA = 1e-5 (stated where it is defined; every run is
seeded, so a run is deterministic), and the tests at the end check that each statistic rejects
each biased residual at the sample size used here, so the power is known and stays known.
"""

from __future__ import annotations

import functools
import math

import pytest
import torch

from sdcp_fast.kernels import verify_speculative

from . import stat_support as S
from .support import backend_params, call, interpreted

BACKENDS = backend_params("reference", "cpu", "triton")
SEED = {"close": 1, "far": 2, "disjoint": 3}


def _verify(backend: str, kind: S.Kind, tokens: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    n = tokens.numel()
    accepted, emitted, bad = call(verify_speculative, kind.logits.repeat(n, 1), None, None, None,
                                  kind.q.repeat(n, 1), tokens, torch.arange(n + 1), u, backend=backend)
    assert not bad.any()
    return accepted, emitted


@functools.cache
def _sample(backend: str, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """kind.sessions one-token proposals of one kind through one backend."""
    kind = S.KINDS[name]
    return _verify(backend, kind, *S.draws(kind, kind.sessions, SEED[name]))


def _skip_interpreted(backend: str) -> None:
    if interpreted(backend):
        # Measured: 60-200 ms per session under TRITON_INTERPRET (9 programs each, run one at
        # a time in Python), so the 7,000-12,000 sessions of a kind would take 10-40 minutes.
        pytest.skip("triton's CPU interpreter takes 60-200 ms per session: the grid test covers it here, "
                    "the sampled statistics run on a GPU")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", list(S.KINDS))
def test_emitted_tokens_follow_p(backend: str, kind: str) -> None:
    """chi-squared at position 1 against p; chi-squared and total variation of the tokens drawn
    at a rejection against the normalized residual; chi-squared at position 2 against p2; the
    acceptance rate against sum(min(p, q)) (stat_support.failures)."""
    _skip_interpreted(backend)
    accepted, emitted = _sample(backend, kind)
    # False rejection of an exact kernel: <= 5 statistics x ALPHA = 5e-5 (seeded: fixed per run).
    assert S.failures(S.KINDS[kind], accepted, emitted) == []


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", list(S.KINDS))
def test_grid_of_uniforms_walks_the_rule(backend: str, kind: str) -> None:
    """Deterministic (no false rejection): over a grid of uniforms the residual draw and the
    final draw land where the rule puts them, to one grid step."""
    k = S.KINDS[kind]
    tokens, u, _ = S.grid_inputs(k)
    accepted, emitted = _verify(backend, k, tokens, u)
    # False rejection: 0 (deterministic bounds; only a uniform within 1e-6 of a CDF step could
    # flip, and S.grid_is_clear rules that out).
    assert S.grid_failures(k, tokens, accepted, emitted) == []


# -- the tests of the tests -----------------------------------------------------------------

@pytest.mark.parametrize("kind", list(S.KINDS))
def test_exact_sampler_passes(kind: str) -> None:
    """The biased sampler with the exact residual passes: what fails below is the residual."""
    k = S.KINDS[kind]
    # False rejection: <= 5e-5, as for the kernels (same statistics, same seeded inputs).
    assert S.failures(k, *S.biased_verify(k, *S.draws(k, k.sessions, SEED[kind]))) == []
    tokens, u, _ = S.grid_inputs(k)
    assert S.grid_is_clear(k)
    assert S.grid_failures(k, tokens, *S.biased_verify(k, tokens, u)) == []


@pytest.mark.parametrize("mutant", list(S.MUTANTS))
@pytest.mark.parametrize("kind", list(S.KINDS))
def test_every_statistic_rejects_biased_residuals(kind: str, mutant: str) -> None:
    """Fed the same seeded inputs as the kernels, a sampler whose residual is p, |p - q| or
    max(p - 0.9q, 0) fails every statistic that involves the residual (the acceptance rate and
    position 2 do not), and the grid test."""
    k, residual = S.KINDS[kind], S.MUTANTS[mutant]
    # Missed rejection: <= ALPHA per statistic (test_sample_size_gives_the_power); grid: 0.
    failed = S.failures(k, *S.biased_verify(k, *S.draws(k, k.sessions, SEED[kind]), residual))
    for statistic in ("chi2(position 1, p)", "chi2(position 1 | rejected, residual)",
                      "TV(position 1 | rejected, residual)"):
        assert any(f.startswith(statistic) for f in failed), (statistic, failed)
    tokens, u, _ = S.grid_inputs(k)
    assert any(f.startswith("residual") for f in S.grid_failures(k, tokens, *S.biased_verify(k, tokens, u, residual)))


@pytest.mark.parametrize("mutant", list(S.MUTANTS))
@pytest.mark.parametrize("kind", list(S.KINDS))
def test_sample_size_gives_the_power(kind: str, mutant: str) -> None:
    """The rejections above are not luck of the seed: at kind.sessions sessions each statistic
    rejects the biased sampler with probability >= 1 - ALPHA, computed from its exact
    output distribution."""
    k, residual = S.KINDS[kind], S.MUTANTS[mutant]
    p, biased = k.p[0], S.emitted_distribution(k, residual)
    n = k.sessions
    assert torch.allclose(S.emitted_distribution(k), p, atol=1e-12)
    exact, wrong = S.normalized_residual(k), S.normalized_residual(k, residual)
    beta = 1 - float(torch.minimum(p, k.q[0].double()).sum())
    rejected = int(beta * n - math.sqrt(n * math.log(1 / S.ALPHA) / 2))  # at least, w.p. >= 1 - ALPHA
    # TV: the biased draws are within tv_bound of their own distribution (w.p. >= 1 - ALPHA),
    # so they exceed the test's bound whenever the distributions are this far apart.
    tv = 0.5 * float((wrong - exact).abs().sum())
    assert tv > S.tv_bound(exact, rejected) + S.tv_bound(wrong, rejected), (tv, S.tv_bound(exact, rejected))
    # chi-squared: a biased sampler that emits a token of probability 0 fails outright; else
    # the statistic is noncentral chi-squared with lam = n * sum((b - p)^2 / p); the normal
    # approximation of its lower tail must sit above the ALPHA critical value.
    if bool((biased[p == 0] > 0).any()):
        assert float(biased[p == 0].sum()) * n > 50
    else:
        df = int((p > 0).sum()) - 1
        lam = n * float(((biased - p)[p > 0] ** 2 / p[p > 0]).sum())
        critical = _chi2_critical(df, S.ALPHA)
        z = 4.27  # normal quantile of 1 - ALPHA
        assert df + lam - z * math.sqrt(2 * (df + 2 * lam)) > critical, (lam, critical)
    # Given a rejection, every biased residual puts mass where the residual has none.
    assert float(wrong[exact == 0].sum()) * rejected > 50
    # Grid: a count off by 2 or more from the exact one cannot come from an exact draw.
    assert float((S.GRID * (wrong - exact)).abs().max()) >= 2


def _chi2_critical(df: int, alpha: float) -> float:
    """Upper alpha quantile of chi-squared(df), by bisection on its survival function."""
    lo, hi = 0.0, 1000.0
    for _ in range(100):
        mid = (lo + hi) / 2
        sf = float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64),
                                           torch.tensor(mid / 2, dtype=torch.float64)))
        lo, hi = (mid, hi) if sf > alpha else (lo, mid)
    return hi
