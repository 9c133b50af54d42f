"""Round vectors (rounds_rule1.json, rounds_rule2.json): the files match the generator, the
pure-Python rules and the digest chain reproduce them from their inputs alone, and every
kernel backend that runs here emits the same tokens."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from sdcp_fast.protocol.acceptance import greedy, profile_distribution, speculative
from sdcp_fast.protocol.digests import extend_digest
from sdcp_fast.protocol.messages import Action, Sampling, Verdict
from sdcp_fast.protocol.randoms import VerifierRandom

HERE = Path(__file__).resolve().parent
SCRIPT = HERE.parent.parent / "scripts" / "make_round_vectors.py"
RULE1 = json.loads((HERE / "rounds_rule1.json").read_text())
RULE2 = json.loads((HERE / "rounds_rule2.json").read_text())


def _script():
    spec = importlib.util.spec_from_file_location("make_round_vectors", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_files_match_generator():
    assert _script().main(["--check"]) == 0, "run: python scripts/make_round_vectors.py"


def _check_chain_and_verdict(case, rnd):
    digest = bytes.fromhex(rnd["base_digest"])
    assert extend_digest(digest, rnd["emitted"]).hex() == rnd["digest"]
    v = Verdict.decode(bytes.fromhex(rnd["verdict_cbor"]))
    assert (v.session.hex(), v.round, v.accepted, list(v.emitted), v.committed, v.digest.hex(), int(v.action)) == (
        case["session"], rnd["round"], rnd["accepted"], rnd["emitted"], rnd["committed"], rnd["digest"],
        rnd["action"])


def _follow_sessions(cases):
    for case in cases:
        digest, committed = case["d0"], 0
        for rnd in case["rounds"]:
            assert (rnd["base"], rnd["base_digest"]) == (committed, digest)
            _check_chain_and_verdict(case, rnd)
            digest, committed = rnd["digest"], rnd["committed"]


def test_rule1_rounds_reproduce():
    _follow_sessions(RULE1["sessions"])
    for case in RULE1["sessions"]:
        stop, max_new = case["contract"]["stop"], case["contract"]["max_new"]
        for rnd in case["rounds"]:
            result = greedy(rnd["logits"], rnd["proposed"])
            assert (result.accepted, result.next_token) == (rnd["accepted"], rnd["next_token"])
            full = rnd["proposed"][: result.accepted] + [result.next_token]
            cut = next((k + 1 for k, t in enumerate(full) if t in stop), len(full))
            assert rnd["emitted"] == full[:cut][: max_new - rnd["base"]]
    assert RULE1["sessions"][0]["rounds"][-1]["action"] == Action.FINISH


def _sampling(case):
    return Sampling(**case["sampling"])


def test_rule2_rounds_reproduce():
    _follow_sessions(RULE2["sessions"])
    for case in RULE2["sessions"]:
        sampling = _sampling(case)
        rng = VerifierRandom(sampling.seed, bytes.fromhex(case["session"]))
        for rnd in case["rounds"]:
            assert [profile_distribution(row, sampling) for row in rnd["logits"]] == rnd["p"]
            m = len(rnd["proposed"])
            assert rnd["uniforms"] == [[rng.uniform(rnd["round"], i, k) for k in (0, 1)] for i in range(1, m + 2)]
            result = speculative(rnd["p"], rnd["q"], rnd["proposed"],
                                 lambda i, k, u=rnd["uniforms"]: u[i - 1][k])
            assert (result.accepted, result.next_token) == (rnd["accepted"], rnd["next_token"])
            assert rnd["emitted"] == rnd["proposed"][: result.accepted] + [result.next_token]
    assert RULE2["refused"][0]["problem"] == "sdcp-bad-proposal"


def test_rule2_vectors_exercise_both_outcomes():
    rounds = [r for case in RULE2["sessions"] for r in case["rounds"]]
    assert any(r["accepted"] == len(r["proposed"]) for r in rounds)
    assert any(r["accepted"] < len(r["proposed"]) for r in rounds)
    assert any(r["accepted"] == 0 for r in rounds)


# -- the kernels against the same vectors -------------------------------------------------

torch = pytest.importorskip("torch", reason="the kernel cross-check needs torch")


def _backend_or_skip(name):
    from sdcp_fast.kernels import backends

    why = backends._reason(name)
    if why is not None:
        pytest.skip(why)
    return name


@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_kernels_rule1(backend):
    from sdcp_fast.kernels.verify import verify_greedy

    _backend_or_skip(backend)
    rounds = [r for case in RULE1["sessions"] for r in case["rounds"]]
    logits = torch.tensor([row for r in rounds for row in r["logits"]], dtype=torch.float32)
    draft = torch.tensor([t for r in rounds for t in r["proposed"]], dtype=torch.int64)
    cu = torch.tensor([0] + list(_cumsum(len(r["proposed"]) for r in rounds)), dtype=torch.int64)
    accepted, emitted = verify_greedy(logits, draft, cu, backend=backend)
    for b, r in enumerate(rounds):
        assert int(accepted[b]) == r["accepted"]
        row = [int(t) for t in emitted[b] if int(t) != -1]
        assert row == r["proposed"][: r["accepted"]] + [r["next_token"]]


@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_kernels_rule2(backend):
    from sdcp_fast.kernels.sampling import apply_sampling_profile
    from sdcp_fast.kernels.verify import verify_speculative

    _backend_or_skip(backend)
    for case in RULE2["sessions"]:
        s = _sampling(case)
        rounds = case["rounds"]
        logits = torch.tensor([row for r in rounds for row in r["logits"]], dtype=torch.float32)
        p = apply_sampling_profile(logits, s.temperature_milli, s.top_k, s.top_p_milli, backend=backend)
        want = torch.tensor([row for r in rounds for row in r["p"]], dtype=torch.float64)
        assert torch.allclose(p.double(), want, atol=1e-6, rtol=1e-5)
        q = torch.tensor([row for r in rounds for row in r["q"]], dtype=torch.float32)
        draft = torch.tensor([t for r in rounds for t in r["proposed"]], dtype=torch.int64)
        cu = torch.tensor([0] + list(_cumsum(len(r["proposed"]) for r in rounds)), dtype=torch.int64)
        m_max = max(len(r["proposed"]) for r in rounds)
        u = torch.zeros(len(rounds), m_max + 1, 2, dtype=torch.float64)
        for b, r in enumerate(rounds):
            u[b, : len(r["uniforms"])] = torch.tensor(r["uniforms"], dtype=torch.float64)
        accepted, emitted, bad = verify_speculative(logits, s.temperature_milli, s.top_k, s.top_p_milli, q, draft,
                                                    cu, u, backend=backend)
        for b, r in enumerate(rounds):
            assert not bool(bad[b])
            assert int(accepted[b]) == r["accepted"], (case["note"], b)
            assert [int(t) for t in emitted[b] if int(t) != -1] == r["emitted"], (case["note"], b)


@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_kernels_refuse_zero_q(backend):
    from sdcp_fast.kernels.verify import verify_speculative

    _backend_or_skip(backend)
    refused = RULE2["refused"][0]
    v = RULE2["vocab"]
    logits = torch.zeros(len(refused["proposed"]) + 1, v, dtype=torch.float32)
    q = torch.tensor(refused["q"], dtype=torch.float32)
    draft = torch.tensor(refused["proposed"], dtype=torch.int64)
    cu = torch.tensor([0, len(refused["proposed"])], dtype=torch.int64)
    u = torch.full((1, len(refused["proposed"]) + 1, 2), 0.5, dtype=torch.float64)
    accepted, emitted, bad = verify_speculative(logits, None, None, None, q, draft, cu, u, backend=backend)
    assert bool(bad[0]) and int(accepted[0]) == 0


EDGE_PROFILES = [Sampling(), Sampling(temperature_milli=0), Sampling(top_k=0), Sampling(top_p_milli=0),
                 Sampling(top_p_milli=1000), Sampling(top_k=1), Sampling(top_p_milli=1), Sampling(top_k=2, top_p_milli=999),
                 Sampling(temperature_milli=1, top_k=3), Sampling(temperature_milli=5000, top_p_milli=500)]


@pytest.mark.parametrize("backend", ["reference", "cpu"])
@pytest.mark.parametrize("sampling", EDGE_PROFILES, ids=repr)
def test_kernel_profile_agrees_on_edge_cases(backend, sampling):
    """Absent and zero members, one-token filters and tied logits mean the same in both."""
    from sdcp_fast.kernels.sampling import apply_sampling_profile

    _backend_or_skip(backend)
    rows = [[0.5, 2.0, 2.0, -1.0, 0.25], [3.0, 3.0, 3.0, 3.0, 3.0], [-4.0, 0.0, 1.5, 1.5, 7.0]]
    got = apply_sampling_profile(torch.tensor(rows, dtype=torch.float32), sampling.temperature_milli,
                                 sampling.top_k, sampling.top_p_milli, backend=backend)
    want = torch.tensor([profile_distribution(r, sampling) for r in rows], dtype=torch.float64)
    assert torch.equal(got > 0, want > 0)
    assert torch.allclose(got.double(), want, atol=1e-6)


def _cumsum(values):
    total = 0
    for v in values:
        total += v
        yield total
