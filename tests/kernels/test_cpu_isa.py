"""The cpu backend under every instruction set this CPU runs (scalar, AVX2; sdcp_fast._C picks
the widest at run time), each against the reference: sizes that are not a multiple of the
vector width or of the 2048-id block, one-id rows, B = 1, M = 1, bfloat16, every profile
member, top-k/top-p cuts beyond the near candidates (the full-histogram path) and rows
whose blocks run in parallel. The other kernel tests cover the widest set only."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest
import torch

from sdcp_fast import native
from sdcp_fast.kernels import apply_sampling_profile, sample_from_probs, verify_greedy

from .inputs import logits, ragged
from .support import BOUNDARY_CASES
from .test_verify import _compare, _spec_batch

if native.available():
    from sdcp_fast.kernels import cpu_backend

    ISAS = cpu_backend.isas()
else:  # collected without the extension: every test below skips with the reason
    ISAS = ["none"]
pytestmark = pytest.mark.skipif(not native.available(), reason=native.status())

VOCABS = [1, 7, 9, 17, 2049, 4111]
PROFILES = [
    dict(),
    dict(temperature_milli=0),
    dict(temperature_milli=700, top_k=5),
    dict(top_p_milli=500),
    dict(temperature_milli=1300, top_k=50, top_p_milli=900),
]


def _pid(d: dict[str, int]) -> str:
    return "-".join(f"{k}={v}" for k, v in d.items()) or "plain"


@pytest.fixture(params=ISAS)
def isa(request: pytest.FixtureRequest) -> Iterator[str]:
    before = cpu_backend.isa()
    cpu_backend.use_isa(request.param)
    yield request.param
    cpu_backend.use_isa(before)


def _assert_profile(x: torch.Tensor, **profile: object) -> None:
    want = apply_sampling_profile(x, backend="reference", **profile)
    got = apply_sampling_profile(x, backend="cpu", **profile)
    assert torch.equal(got == 0, want == 0), "kept sets differ"
    torch.testing.assert_close(got, want, rtol=2e-5, atol=1e-7)


@pytest.mark.parametrize("vocab", VOCABS)
@pytest.mark.parametrize("kind", ["random", "ties", "onehot"])
@pytest.mark.parametrize("profile", PROFILES, ids=_pid)
def test_profile_odd_sizes(isa: str, vocab: int, kind: str, profile: dict[str, int]) -> None:
    x = logits(torch.Generator().manual_seed(vocab), 3, vocab, kind)
    _assert_profile(x, **profile)
    if kind == "random":
        _assert_profile(x.to(torch.bfloat16), **profile)


SPEC = [(9, [1]), (2049, [1]), (4111, [1, 4, 0]), (17, [8, 3]), (1, [2, 1])]


@pytest.mark.parametrize("vocab,ms", SPEC, ids=[f"V{v}-M{'-'.join(map(str, ms))}" for v, ms in SPEC])
@pytest.mark.parametrize("profile", PROFILES, ids=_pid)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_speculative_odd_sizes(isa: str, vocab: int, ms: list[int], profile: dict[str, int],
                               dtype: torch.dtype) -> None:
    for closeness in ("close", "far"):
        args = _spec_batch(vocab + len(ms), vocab, ms, closeness=closeness, profile=profile)
        args["target_logits"] = args["target_logits"].to(dtype)
        BOUNDARY_CASES.append(_compare("cpu", args))


@pytest.mark.parametrize("vocab", [9, 2049, 4111])
def test_greedy_and_sampling_odd_sizes(isa: str, vocab: int) -> None:
    gen = torch.Generator().manual_seed(vocab)
    for kind in ("random", "ties"):
        x = logits(gen, 7, vocab, kind)  # sessions of 2, 0 and 2 drafts own rows 0-2, 3 and 4-6
        tokens = x[[0, 1, 4, 5]].argmax(1)
        tokens[1] = (tokens[1] + 1) % vocab
        args = (x, tokens, ragged([2, 0, 2]))
        want = verify_greedy(*args, backend="reference")
        got = verify_greedy(*args, backend="cpu")
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    probs = torch.softmax(logits(gen, 5, vocab), 1)
    probs[:, ::3] = 0.0
    u = torch.rand(5, generator=gen, dtype=torch.float64)
    assert torch.equal(sample_from_probs(probs, u, backend="cpu"), sample_from_probs(probs, u, backend="reference"))


def _wide_rows(gen: torch.Generator, rows: int, vocab: int) -> torch.Tensor:
    """A max at 0, a crowd at -9 holding about a third of the mass, the rest at -30: top-p 0.9
    and top-k 100 cut in the crowd, beyond the candidates near the max."""
    x = torch.full((rows, vocab), -30.0)
    for r in range(rows):
        perm = torch.randperm(vocab, generator=gen)
        x[r, perm[:4000]] = -9.0 + 0.01 * torch.randn(4000, generator=gen)
        x[r, perm[4000]] = 0.0
    return x


@pytest.mark.parametrize("profile", [dict(top_p_milli=900), dict(top_k=100), dict(top_k=3000, top_p_milli=950)],
                         ids=_pid)
def test_cut_beyond_the_near_candidates(isa: str, profile: dict[str, int]) -> None:
    gen = torch.Generator().manual_seed(21)
    x = _wide_rows(gen, 3, 9001)
    _assert_profile(x, **profile)
    ms = [1, 1]
    args = _spec_batch(22, 9001, ms, closeness="far", profile=profile)
    args["target_logits"] = _wide_rows(gen, 4, 9001)
    BOUNDARY_CASES.append(_compare("cpu", args))


@pytest.mark.parametrize("profile", [dict(), dict(temperature_milli=800, top_k=40, top_p_milli=900)], ids=_pid)
def test_one_long_row_in_parallel_blocks(isa: str, profile: dict[str, int]) -> None:
    """B = 1 with V = 70001 (35 blocks): the blocks of a row run on several threads."""
    args = _spec_batch(23, 70001, [2], closeness="close", profile=profile)
    BOUNDARY_CASES.append(_compare("cpu", args))
    _assert_profile(args["target_logits"][:1], **profile)


def test_choosing_the_instruction_set() -> None:
    assert cpu_backend.isa() in ISAS and ISAS[0] == "scalar"
    with pytest.raises(ValueError):
        cpu_backend.use_isa("no-such-set")
    env = dict(os.environ, SDCP_CPU_ISA="scalar")
    out = subprocess.run([sys.executable, "-c", "from sdcp_fast.kernels import cpu_backend as c; print(c.isa())"],
                         env=env, capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "scalar"
