import pytest
import torch

from sdcp_fast.kernels import apply_sampling_profile, verify_greedy, verify_speculative
from sdcp_fast.kernels.reference import inverse_cdf

from .inputs import draft, logits, ragged
from .support import BOUNDARY_CASES, backend_params, call, device_of, interpreted

BACKENDS = backend_params("cpu", "triton")
ALL = backend_params("reference", "cpu", "triton")

# (B, V, Ms): every B, V and M of the issue, plus mixed M in one batch.
FAMILIES = [
    (1, 111, [1]), (7, 111, [3] * 7), (99, 111, [8] * 99), (1, 4096, [64]), (7, 4096, [1, 3, 8, 64, 0, 2, 5]),
    (99, 4096, [3] * 99), (1, 32000, [8]), (7, 32000, [8, 1, 3, 3, 8, 1, 2]), (99, 32000, [1] * 99),
]
SMALL = [f for f in FAMILIES if f[0] <= 7 and f[1] * (sum(f[2]) + f[0]) <= 60 * 4096]


def _family_ids(f: tuple[int, int, list[int]]) -> str:
    b, v, ms = f
    return f"B{b}-V{v}-M{'mixed' if len(set(ms)) > 1 else ms[0]}"


def _families(backend: str) -> list[tuple[int, int, list[int]]]:
    return SMALL if interpreted(backend) else FAMILIES  # the triton interpreter is slow


def _greedy_batch(gen: torch.Generator, vocab: int, ms: list[int], kind: str) -> tuple[torch.Tensor, ...]:
    x = logits(gen, sum(ms) + len(ms), vocab, kind)
    best = x.argmax(dim=1)
    tokens = []
    for b, m in enumerate(ms):  # follow the argmax for a random number of positions, then deviate
        start = sum(ms[:b]) + b
        keep = int(torch.randint(0, m + 1, (1,), generator=gen))
        for i in range(m):
            t = int(best[start + i])
            tokens.append(t if i < keep else (t + 1 + int(torch.randint(0, vocab - 1, (1,), generator=gen))) % vocab)
    return x, torch.tensor(tokens, dtype=torch.int64), ragged(ms)


@pytest.mark.parametrize("backend", ALL)
@pytest.mark.parametrize("kind", ["random", "ties", "onehot"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_greedy_is_argmax_with_ties_to_smallest_id(backend: str, kind: str, dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(5)
    ms = [1, 3, 8, 0, 5]
    x, tokens, cu = _greedy_batch(gen, 37, ms, kind)
    x = x.to(dtype)
    accepted, emitted = call(verify_greedy, x, tokens, cu, backend=backend)
    assert emitted.shape == (len(ms), max(ms) + 1)
    for b, m in enumerate(ms):
        start = sum(ms[:b]) + b
        rows = x[start : start + m + 1].float()
        best = [int(torch.nonzero(r == r.max())[0]) for r in rows]  # smallest id among the maxima
        a = 0
        while a < m and int(tokens[sum(ms[:b]) + a]) == best[a]:
            a += 1
        assert int(accepted[b]) == a
        assert emitted[b, : a + 1].tolist() == best[: a + 1]
        assert (emitted[b, a + 1 :] == -1).all()  # exactly accepted + 1 tokens


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("family", FAMILIES, ids=_family_ids)
def test_greedy_matches_reference(backend: str, family: tuple[int, int, list[int]]) -> None:
    if family not in _families(backend):
        pytest.skip("shape too large for the triton interpreter")
    b, vocab, ms = family
    x, tokens, cu = _greedy_batch(torch.Generator().manual_seed(b * vocab), vocab, ms, "ties")
    want = verify_greedy(x, tokens, cu, backend="reference")
    got = call(verify_greedy, x, tokens, cu, backend=backend)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def _spec_batch(seed: int, vocab: int, ms: list[int], kind: str = "random", closeness: str = "close",
                profile: dict[str, int] | None = None) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    x = logits(gen, sum(ms) + len(ms), vocab, kind)
    p = torch.softmax(x.double(), dim=1)
    q, tokens = draft(gen, p, ms, closeness)
    u = torch.rand(len(ms), max(ms) + 1, 2, generator=gen, dtype=torch.float64)
    prof = profile or {}
    return dict(target_logits=x, temperature_milli=prof.get("temperature_milli"), top_k=prof.get("top_k"),
                top_p_milli=prof.get("top_p_milli"), q_probs=q, draft_tokens=tokens, cu_draft=ragged(ms),
                uniforms=u)


def _near_boundary(args: dict[str, torch.Tensor], b: int, rel: float = 1e-6) -> bool:
    """Whether some decision of session b has its uniform within ``rel`` of a boundary:
    the acceptance ratio or a CDF step of the residual / final row (float64 reference values)."""
    cu = args["cu_draft"]
    start, end = int(cu[b]), int(cu[b + 1])
    rows = args["target_logits"][start + b : end + b + 1]
    n = rows.shape[0]

    def per_row(key: str) -> torch.Tensor | None:
        v = args[key]
        return v[b : b + 1].expand(n) if isinstance(v, torch.Tensor) else v

    p = apply_sampling_profile(rows, per_row("temperature_milli"), per_row("top_k"), per_row("top_p_milli"),
                               backend="reference").double()
    u = args["uniforms"][b]

    def cdf_near(w: torch.Tensor, r: float) -> bool:
        c = torch.cumsum(w, 0) / w.sum()
        return bool((c - r).abs().min() <= rel)

    for i in range(end - start):
        x = int(args["draft_tokens"][start + i])
        qrow = args["q_probs"][start + i].double()
        ratio = min(1.0, float(p[i, x] / qrow[x]))
        r = float(u[i, 0])
        if abs(r - ratio) <= rel * max(ratio, 1e-300):
            return True
        if r >= ratio:
            return cdf_near(torch.clamp(p[i] - qrow, min=0), float(u[i, 1]))
    return cdf_near(p[-1], float(u[end - start, 1]))


def _compare(backend: str, args: dict[str, torch.Tensor]) -> int:
    """Asserts equality with the reference except at boundary cases; returns their count."""
    want = verify_speculative(**args, backend="reference")
    got = call(verify_speculative, **args, backend=backend)
    assert torch.equal(got[2], want[2]), "bad flags differ"
    differ = [b for b in range(want[0].numel())
              if int(got[0][b]) != int(want[0][b]) or not torch.equal(got[1][b], want[1][b])]
    unexplained = [b for b in differ if not _near_boundary(args, b)]
    assert not unexplained, f"sessions {unexplained} differ from the reference away from any boundary"
    return len(differ)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("family", FAMILIES, ids=_family_ids)
@pytest.mark.parametrize("closeness", ["close", "far"])
def test_speculative_matches_reference(backend: str, family: tuple[int, int, list[int]], closeness: str) -> None:
    if family not in _families(backend):
        pytest.skip("shape too large for the triton interpreter")
    b, vocab, ms = family
    BOUNDARY_CASES.append(_compare(backend, _spec_batch(b + vocab, vocab, ms, closeness=closeness)))


SPECIAL = [
    ("ties", dict()), ("onehot", dict()), ("random", dict(temperature_milli=0)), ("ties", dict(temperature_milli=0)),
    ("random", dict(top_k=1)), ("random", dict(top_p_milli=1)), ("ties", dict(top_k=3, top_p_milli=600)),
    ("random", dict(temperature_milli=400, top_k=20, top_p_milli=900)),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind,profile", SPECIAL, ids=[f"{k}-{p}" for k, p in SPECIAL])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_speculative_special_inputs(backend: str, kind: str, profile: dict[str, int], dtype: torch.dtype) -> None:
    ms = [1, 3, 8, 2, 5]
    args = _spec_batch(11, 300, ms, kind, "close", profile)
    args["target_logits"] = args["target_logits"].to(dtype)
    BOUNDARY_CASES.append(_compare(backend, args))


@pytest.mark.parametrize("backend", BACKENDS)
def test_speculative_per_session_profiles(backend: str) -> None:
    ms = [2, 4, 1, 6]
    args = _spec_batch(12, 500, ms, "random", "close")
    args.update(temperature_milli=torch.tensor([0, 700, 1000, 1500]), top_k=torch.tensor([0, 10, 0, 1]),
                top_p_milli=torch.tensor([0, 0, 300, 0]))
    BOUNDARY_CASES.append(_compare(backend, args))


@pytest.mark.slow
@pytest.mark.parametrize("backend", backend_params("cpu"))
def test_speculative_llama3_vocabulary(backend: str) -> None:
    BOUNDARY_CASES.append(_compare(backend, _spec_batch(13, 128256, [8, 3, 1, 4], closeness="close")))


@pytest.mark.parametrize("backend", ALL)
def test_bad_proposal_flagged_before_any_uniform(backend: str) -> None:
    ms = [3, 2, 4]
    args = _spec_batch(14, 50, ms)
    args["q_probs"][4, args["draft_tokens"][4]] = 0.0  # session 1, position 2
    args["uniforms"][1] = float("nan")  # would poison any decision that read it
    accepted, emitted, bad = call(verify_speculative, **args, backend=backend)
    assert bad.tolist() == [False, True, False]
    assert int(accepted[1]) == 0 and (emitted[1] == -1).all()


@pytest.mark.parametrize("backend", ALL)
def test_structure_and_repeatability(backend: str) -> None:
    ms = [1, 3, 8, 64, 2]
    args = _spec_batch(15, 111, ms, closeness="close")
    accepted, emitted, _ = call(verify_speculative, **args, backend=backend)
    again = call(verify_speculative, **args, backend=backend)
    assert torch.equal(accepted, again[0]) and torch.equal(emitted, again[1])  # bit-identical repeats
    assert emitted.shape == (len(ms), 65)
    for b, m in enumerate(ms):
        a = int(accepted[b])
        assert 0 <= a <= m
        assert (emitted[b, : a + 1] >= 0).all() and (emitted[b, a + 1 :] == -1).all()
        start = sum(ms[:b])
        assert emitted[b, :a].tolist() == args["draft_tokens"][start : start + a].tolist()


@pytest.mark.parametrize("backend", ALL)
def test_session_result_does_not_depend_on_batch(backend: str) -> None:
    ms = [5, 2, 8, 1]
    args = _spec_batch(16, 3000, ms, closeness="close")
    accepted, emitted, _ = call(verify_speculative, **args, backend=backend)
    cu = args["cu_draft"]
    for b, m in enumerate(ms):
        start, end = int(cu[b]), int(cu[b + 1])
        one = dict(target_logits=args["target_logits"][start + b : end + b + 1], temperature_milli=None,
                   top_k=None, top_p_milli=None, q_probs=args["q_probs"][start:end],
                   draft_tokens=args["draft_tokens"][start:end], cu_draft=torch.tensor([0, m]),
                   uniforms=args["uniforms"][b : b + 1, : m + 1])
        a1, e1, _ = call(verify_speculative, **one, backend=backend)
        assert int(a1[0]) == int(accepted[b]) and e1[0].tolist() == emitted[b, : m + 1].tolist()


def test_reference_rule2_by_hand() -> None:
    # p = (0.5, 0.5, 0), q = (0.25, 0.25, 0.5) over 3 tokens; x[1] = 2 has p/q = 0, so it is rejected
    # and the residual max(0, p - q) = (0.25, 0.25, 0) is drawn with purpose-1 uniform 0.6 -> id 1.
    x = torch.log(torch.tensor([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]]))
    q = torch.tensor([[0.25, 0.25, 0.5]])
    u = torch.tensor([[[0.1, 0.6], [0.9, 0.9]]], dtype=torch.float64)
    accepted, emitted, bad = verify_speculative(x, None, None, None, q, torch.tensor([2]), torch.tensor([0, 1]),
                                                u, backend="reference")
    assert accepted.tolist() == [0] and emitted.tolist() == [[1, -1]] and bad.tolist() == [False]
    # accepted x[1] = 0 (ratio 2) then the extra token from p[2] with u = 0.9 -> id 2
    accepted, emitted, _ = verify_speculative(x, None, None, None, q, torch.tensor([0]), torch.tensor([0, 1]),
                                              u, backend="reference")
    assert accepted.tolist() == [1] and emitted.tolist() == [[0, 2]]
    assert int(inverse_cdf(torch.tensor([[0.25, 0.25, 0.0]]), torch.tensor([0.5]))[0]) == 1


@pytest.mark.parametrize("backend", ALL)
def test_residual_without_mass_draws_from_p(backend: str) -> None:
    # q = 1.5 p is not a distribution, but it makes max(0, p - q) zero everywhere: the
    # rejected position then draws from p itself (what the reference defines).
    gen = torch.Generator().manual_seed(17)
    x = torch.randn(4, 40, generator=gen)
    p = torch.softmax(x.double(), 1)
    q = (1.5 * p[[0, 2]]).float()
    tokens = torch.tensor([int(p[0].argmax()), int(p[2].argmax())])
    u = torch.tensor([[[0.9, 0.3], [0.0, 0.0]], [[0.95, 0.8], [0.0, 0.0]]], dtype=torch.float64)
    args = (x, None, None, None, q, tokens, torch.tensor([0, 1, 2]), u)
    want = verify_speculative(*args, backend="reference")
    got = call(verify_speculative, *args, backend=backend)
    assert want[0].tolist() == [0, 0]
    assert torch.equal(got[1], want[1])
    assert int(want[1][0, 0]) == int(inverse_cdf(p[:1], torch.tensor([0.3]))[0])


@pytest.mark.parametrize("backend", ALL)
@pytest.mark.parametrize("family", [(7, 4096, [1, 3, 8, 64, 0, 2, 5]), (7, 111, [3] * 7)], ids=_family_ids)
def test_speculative_takes_each_sessions_rows_where_they_lie(backend: str, family: tuple[int, int, list[int]]) -> None:
    """q_probs as one ``[M_b, V]`` tensor per session, each in a buffer of its own (as rows read
    in place from shared memory): the same results as those rows gathered into one tensor, a
    bad row flagged alike, and a session's rows of the wrong shape or dtype refused."""
    _, vocab, ms = family
    args = _spec_batch(17, vocab, ms, closeness="far")
    cu = args["cu_draft"].tolist()
    args["q_probs"][cu[1], args["draft_tokens"][cu[1]]] = 0.0  # session 1 is bad
    dev = device_of(backend)
    rounds = [args["q_probs"][cu[b] : cu[b + 1]].clone().to(dev) for b in range(len(ms))]
    want = call(verify_speculative, **args, backend=backend)
    got = call(verify_speculative, **{**args, "q_probs": rounds}, backend=backend)
    assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))
    assert want[2].tolist() == [False, True, *[False] * (len(ms) - 2)]
    for wrong in (rounds[3][:-1], rounds[3].double()):
        with pytest.raises(ValueError):
            call(verify_speculative, **{**args, "q_probs": [*rounds[:3], wrong, *rounds[4:]]}, backend=backend)
