"""The protocol core's round vectors (tests/vectors/rounds_rule*.json) through every kernel
backend that runs here; tests/vectors/test_round_vectors.py checks reference and cpu against
the same files, this adds triton (interpreted on CPU, on the GPU where there is one)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from sdcp_fast.kernels import verify_greedy, verify_speculative

from .support import backend_params, call

VECTORS = Path(__file__).resolve().parent.parent / "vectors"


def _load(name: str) -> dict:
    path = VECTORS / name
    if not path.exists():
        pytest.skip(f"{path} not present")
    return json.loads(path.read_text())


def _cu(rounds: list[dict]) -> torch.Tensor:
    return torch.tensor([0] + torch.tensor([len(r["proposed"]) for r in rounds]).cumsum(0).tolist())


@pytest.mark.parametrize("backend", backend_params("reference", "cpu", "triton"))
def test_rule1_rounds(backend: str) -> None:
    rounds = [r for case in _load("rounds_rule1.json")["sessions"] for r in case["rounds"]]
    logits = torch.tensor([row for r in rounds for row in r["logits"]], dtype=torch.float32)
    tokens = torch.tensor([t for r in rounds for t in r["proposed"]], dtype=torch.int64)
    accepted, emitted = call(verify_greedy, logits, tokens, _cu(rounds), backend=backend)
    for b, r in enumerate(rounds):
        assert int(accepted[b]) == r["accepted"]
        assert [int(t) for t in emitted[b] if t >= 0] == r["proposed"][: r["accepted"]] + [r["next_token"]]


@pytest.mark.parametrize("backend", backend_params("reference", "cpu", "triton"))
def test_rule2_rounds(backend: str) -> None:
    for case in _load("rounds_rule2.json")["sessions"]:
        s = case["sampling"]
        rounds = case["rounds"]
        logits = torch.tensor([row for r in rounds for row in r["logits"]], dtype=torch.float32)
        q = torch.tensor([row for r in rounds for row in r["q"]], dtype=torch.float32)
        tokens = torch.tensor([t for r in rounds for t in r["proposed"]], dtype=torch.int64)
        m_max = max(len(r["proposed"]) for r in rounds)
        u = torch.zeros(len(rounds), m_max + 1, 2, dtype=torch.float64)
        for b, r in enumerate(rounds):
            u[b, : len(r["uniforms"])] = torch.tensor(r["uniforms"], dtype=torch.float64)
        accepted, emitted, bad = call(verify_speculative, logits, s.get("temperature_milli"), s.get("top_k"),
                                      s.get("top_p_milli"), q, tokens, _cu(rounds), u, backend=backend)
        assert not bad.any()
        for b, r in enumerate(rounds):
            assert int(accepted[b]) == r["accepted"], (case["note"], b)
            assert [int(t) for t in emitted[b] if t >= 0] == r["proposed"][: r["accepted"]] + [r["next_token"]]
