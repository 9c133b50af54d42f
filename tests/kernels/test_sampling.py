import pytest
import torch

from sdcp_fast.kernels import apply_sampling_profile, sample_from_probs

from .inputs import logits
from .support import backend_params, call, interpreted

BACKENDS = backend_params("cpu", "triton")

# (rows, V): the triton interpreter is slow, so it gets the small shapes only.
SHAPES = [(1, 111), (7, 4096), (99, 111), (7, 32000)]
PROFILES = [
    dict(),
    dict(temperature_milli=0),
    dict(temperature_milli=700, top_k=1),
    dict(top_p_milli=1),
    dict(temperature_milli=1300, top_k=50, top_p_milli=900),
    dict(top_k=5),
    dict(top_p_milli=500),
]


def _interp_too_big(backend: str, rows: int, vocab: int) -> bool:
    return interpreted(backend) and rows * vocab > 7 * 4096


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("rows,vocab", SHAPES)
@pytest.mark.parametrize("kind", ["random", "ties", "onehot"])
@pytest.mark.parametrize("profile", PROFILES, ids=lambda d: "-".join(f"{k}={v}" for k, v in d.items()) or "plain")
def test_profile_matches_reference(backend: str, rows: int, vocab: int, kind: str, profile: dict[str, int]) -> None:
    if _interp_too_big(backend, rows, vocab) or (interpreted(backend) and rows > 7 and (profile or kind != "random")):
        pytest.skip("shape too large for the triton interpreter")
    x = logits(torch.Generator().manual_seed(rows * vocab), rows, vocab, kind)
    want = apply_sampling_profile(x, backend="reference", **profile)
    got = call(apply_sampling_profile, x, backend=backend, **profile)
    assert torch.equal(got == 0, want == 0), "kept sets differ"
    torch.testing.assert_close(got, want, rtol=2e-5, atol=1e-7)


@pytest.mark.parametrize("backend", BACKENDS)
def test_profile_per_row_parameters_and_bf16(backend: str) -> None:
    gen = torch.Generator().manual_seed(3)
    x = logits(gen, 6, 500).to(torch.bfloat16)
    temp = torch.tensor([0, 1000, 500, 2000, 1000, 1000])
    top_k = torch.tensor([0, 3, 0, 40, 0, 499])
    top_p = torch.tensor([0, 0, 950, 800, 1, 999])
    want = apply_sampling_profile(x, temp, top_k, top_p, backend="reference")
    got = call(apply_sampling_profile, x, temp, top_k, top_p, backend=backend)
    assert torch.equal(got == 0, want == 0)
    torch.testing.assert_close(got, want, rtol=2e-5, atol=1e-7)


def test_reference_semantics() -> None:
    x = torch.tensor([[1.0, 3.0, 3.0, 2.0, -1.0]])
    assert apply_sampling_profile(x, temperature_milli=0, backend="reference").tolist() == [[0, 1, 0, 0, 0]]
    # top-k boundary tie: ids 1 and 2 tie, top_k=1 keeps the smaller id
    assert apply_sampling_profile(x, top_k=1, backend="reference").tolist() == [[0, 1, 0, 0, 0]]
    two = apply_sampling_profile(x, top_k=2, backend="reference")[0]
    assert two[1] == two[2] == pytest.approx(0.5) and two[[0, 3, 4]].sum() == 0
    # top-p keeps j iff the mass ranked before j is < top_p: the 2nd tied token's predecessor holds < 0.9
    p = torch.softmax(x.double(), 1)[0]
    kept = apply_sampling_profile(x, top_p_milli=int(1000 * float(p[1])) + 1, backend="reference")[0]
    assert (kept > 0).tolist() == [False, True, True, False, False]
    assert torch.allclose(apply_sampling_profile(x, backend="reference")[0].double(), p)
    assert torch.allclose(apply_sampling_profile(x, top_k=5, top_p_milli=1000, backend="reference")[0].double(), p)


def test_profile_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError):
        apply_sampling_profile(torch.zeros(2, 3, dtype=torch.float64))
    with pytest.raises(ValueError):
        apply_sampling_profile(torch.zeros(2, 3), top_k=torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError):
        apply_sampling_profile(torch.zeros(2, 3), top_p_milli=-1)


@pytest.mark.parametrize("backend", backend_params("reference", "cpu", "triton"))
def test_sample_from_probs_rule(backend: str) -> None:
    probs = torch.tensor([[0.0, 0.25, 0.0, 0.75], [0.0, 0.25, 0.0, 0.75], [1.0, 1.0, 1.0, 1.0],
                          [0.0, 0.0, 0.0, 0.0], [0.0, 2.0, 0.0, 0.0]], dtype=torch.float32)
    u = torch.tensor([0.0, 0.25, 0.999999, 0.5, 0.7], dtype=torch.float64)
    # u * total = 0.25 is not exceeded by the cumulative 0.25 of id 1: the draw moves on to id 3
    assert call(sample_from_probs, probs, u, backend=backend).tolist() == [1, 3, 3, -1, 1]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("rows,vocab", [(1, 111), (9, 4096), (3, 32000)])
def test_sample_from_probs_matches_reference(backend: str, rows: int, vocab: int) -> None:
    if _interp_too_big(backend, rows, vocab):
        pytest.skip("shape too large for the triton interpreter")
    gen = torch.Generator().manual_seed(vocab)
    probs = torch.softmax(logits(gen, rows, vocab), 1)
    probs[:, ::3] = 0.0
    u = torch.rand(rows, generator=gen, dtype=torch.float64)
    want = sample_from_probs(probs, u, backend="reference")
    got = call(sample_from_probs, probs, u, backend=backend)
    assert torch.equal(got, want)
