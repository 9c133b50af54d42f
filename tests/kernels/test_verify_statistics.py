"""Rule 2 statistics: the emitted tokens follow p whatever q is, and the acceptance rate is
sum(min(p, q)). Trials are sessions of one batch (each with its own draft tokens and
uniforms), so a test is a few calls. The triton backend runs these only on a GPU."""

from __future__ import annotations

import math

import pytest
import torch

from sdcp_fast.kernels import verify_speculative

from .support import backend_params, call

VOCAB = 1000
M = 2
STAT_BACKENDS = backend_params("reference", "cpu") + (backend_params("triton") if torch.cuda.is_available() else [])


def _rows(kind: str, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Target logits [M+1, V] and draft rows q [M, V] for one kind of drafter."""
    x = torch.randn(M + 1, VOCAB, generator=gen) * 2.0
    if kind == "disjoint":  # p lives on even ids, q on odd ids
        x[:, 1::2] = float("-inf")
    p = torch.softmax(x.double(), dim=1)[:M]
    if kind == "close":
        q = torch.softmax(torch.log(p) + 0.2 * torch.randn(p.shape, generator=gen, dtype=torch.float64), 1)
    elif kind == "far":
        q = torch.softmax(torch.randn(p.shape, generator=gen, dtype=torch.float64) * 2.0, 1)
    else:
        q = torch.softmax(torch.randn(p.shape, generator=gen, dtype=torch.float64), 1)
        q[:, 0::2] = 0.0
        q = q / q.sum(1, keepdim=True)
    return x, q.to(torch.float32)


def _run(backend: str, x: torch.Tensor, q: torch.Tensor, trials: int, gen: torch.Generator,
         chunk: int = 4000) -> tuple[torch.Tensor, torch.Tensor]:
    accepted, emitted = [], []
    for start in range(0, trials, chunk):
        n = min(chunk, trials - start)
        tokens = torch.stack([torch.multinomial(q[i].double(), n, replacement=True, generator=gen)
                              for i in range(M)], dim=1).reshape(-1)
        u = torch.rand(n, M + 1, 2, generator=gen, dtype=torch.float64)
        a, e, bad = call(verify_speculative, x.repeat(n, 1), None, None, None, q.repeat(n, 1), tokens,
                                       torch.arange(0, n * M + 1, M), u, backend=backend)
        assert not bad.any()
        accepted.append(a)
        emitted.append(e)
    return torch.cat(accepted), torch.cat(emitted)


def _chi2(samples: torch.Tensor, p: torch.Tensor) -> tuple[float, int]:
    n = samples.numel()
    observed = torch.bincount(samples.long(), minlength=p.numel()).double()
    expected = p * n
    small = expected < 5  # merged into one bin
    assert observed[p == 0].sum() == 0, "a token with p = 0 was emitted"
    obs = torch.cat([observed[~small], observed[small].sum().reshape(1)])
    exp = torch.cat([expected[~small], expected[small].sum().reshape(1)])
    keep = exp > 0
    obs, exp = obs[keep], exp[keep]
    return float(((obs - exp) ** 2 / exp).sum()), obs.numel() - 1


def _tv_noise_floor(p: torch.Tensor, n: int) -> float:
    """E[TV] of an exact sample of size n: 0.5 * sum E|X_j/n - p_j| ~ 0.5 * sum sqrt(2 p_j (1-p_j) / (pi n))."""
    return float(0.5 * torch.sqrt(2 * p * (1 - p) / (math.pi * n)).sum())


@pytest.mark.parametrize("backend", STAT_BACKENDS)
@pytest.mark.parametrize("kind", ["close", "far", "disjoint"])
def test_emitted_tokens_follow_p(backend: str, kind: str) -> None:
    if backend == "reference" and kind != "close":
        pytest.skip("the reference is checked on one kind; it is slow per session")
    gen = torch.Generator().manual_seed({"close": 1, "far": 2, "disjoint": 3}[kind])
    x, q = _rows(kind, gen)
    p = torch.softmax(x.double(), dim=1)
    trials = 12 * VOCAB
    accepted, emitted = _run(backend, x, q, trials, gen)
    tested = 0
    for i in range(M + 1):
        reached = accepted >= i  # a token is emitted at position i+1 when the first i were accepted
        if int(reached.sum()) < 10 * VOCAB:
            continue
        chi2, df = _chi2(emitted[reached, i], p[i])
        assert chi2 < df + 10 * math.sqrt(2 * df), f"position {i + 1}: chi2 {chi2:.1f} with {df} df"
        tested += 1
    assert tested >= 1
    # acceptance at position 1 is Bernoulli(sum(min(p, q)))
    alpha = float(torch.minimum(p[0], q[0].double()).sum())
    rate = float((accepted >= 1).double().mean())
    se = math.sqrt(max(alpha * (1 - alpha), 1e-12) / trials)
    assert abs(rate - alpha) < 4 * se + 1e-12, f"acceptance {rate:.4f} vs sum(min(p, q)) {alpha:.4f}"


@pytest.mark.parametrize("backend", backend_params("cpu") + (backend_params("triton") if torch.cuda.is_available()
                                                              else []))
def test_total_variation_within_noise_floor(backend: str) -> None:
    gen = torch.Generator().manual_seed(4)
    x, q = _rows("far", gen)
    p = torch.softmax(x.double(), dim=1)[0]
    n = 65536
    _, emitted = _run(backend, x, q, n, gen, chunk=16384)
    freq = torch.bincount(emitted[:, 0].long(), minlength=VOCAB).double() / n
    tv = 0.5 * float((freq - p).abs().sum())
    floor = _tv_noise_floor(p, n)
    # The TV of an exact sampler concentrates near the floor (sd of a few percent of it here).
    assert tv < 1.25 * floor, f"TV {tv:.5f} above the noise floor {floor:.5f} (n={n}, V={VOCAB})"
