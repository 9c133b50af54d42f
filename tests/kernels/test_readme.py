"""The README's "Use the kernels from your engine" example runs as written, on every backend,
and what it computes is right: each kernel call it makes is recorded and its results checked
against the rules of docs/kernels.md, computed here from the inputs alone."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import torch

import sdcp_fast.kernels as K

from .support import backend_params, call

README = Path(__file__).resolve().parents[2] / "README.md"
RECORDED = ("verify_greedy", "verify_speculative", "apply_sampling_profile", "sample_from_probs",
            "write_paged_kv", "gather_paged_kv")


def _example() -> str:
    section = README.read_text().split("## Use the kernels from your engine", 1)[1]
    block = re.search(r"```python\n(.*?)```", section, re.S)
    assert block is not None, "the section lost its python example"
    return block.group(1)


Calls = dict[str, list[tuple[tuple[Any, ...], dict[str, Any], Any]]]


def _recorder(calls: Calls, name: str, backend: str) -> Any:
    fn = getattr(K, name)

    def record(*args: Any, **kwargs: Any) -> Any:
        result = call(fn, *args, backend=backend, **kwargs)  # CPU tensors stay themselves: writes land in place
        calls[name].append((args, kwargs, result))
        return result
    return record


def _run(monkeypatch: pytest.MonkeyPatch, backend: str) -> Calls:
    """Runs the example with every recorded kernel on ``backend``; (args, kwargs, result) per call."""
    calls: Calls = {name: [] for name in RECORDED}
    for name in RECORDED:
        monkeypatch.setattr(K, name, _recorder(calls, name, backend))
    torch.manual_seed(0)  # the example draws its inputs from torch's global generator
    exec(compile(_example(), "README.md", "exec"), {})  # noqa: S102 - our own documentation
    return calls


def _rows(cu_draft: torch.Tensor) -> list[tuple[list[int], int]]:
    """(draft indices, first target row) of each session of a ragged batch."""
    cu = cu_draft.tolist()
    return [(list(range(cu[b], cu[b + 1])), cu[b] + b) for b in range(len(cu) - 1)]


def _kept(row: torch.Tensor, top_k: int) -> set[int]:
    order = sorted(range(row.numel()), key=lambda j: (-float(row[j]), j))
    return set(order[:top_k])


@pytest.mark.parametrize("backend", backend_params("reference", "cpu", "triton"))
def test_readme_kernel_example_results(monkeypatch: pytest.MonkeyPatch, backend: str) -> None:
    if backend == "triton" and torch.cuda.is_available():
        pytest.skip("the example's tensors are on the CPU; triton runs them only under the interpreter")
    calls = _run(monkeypatch, backend)
    assert all(len(calls[name]) == 1 for name in RECORDED), {k: len(v) for k, v in calls.items()}

    # Rule 1: accepted[b] drafts equal the target rows' first argmax, then that row's argmax.
    (logits, draft, cu), _, (accepted, emitted) = calls["verify_greedy"][0]
    best = logits.argmax(dim=1)
    for b, (idx, row) in enumerate(_rows(cu)):
        a = 0
        while a < len(idx) and int(draft[idx[a]]) == int(best[row + a]):
            a += 1
        assert int(accepted[b]) == a
        assert emitted[b].tolist() == best[row : row + a + 1].tolist() + [-1] * (emitted.shape[1] - a - 1)

    # Rule 2: accepted + 1 tokens, the accepted ones are the drafts, all in the top-k kept set.
    (logits, temp, top_k, _, q, draft, cu, u), _, (accepted, emitted, bad) = calls["verify_speculative"][0]
    assert not bad.any()
    for b, (idx, row) in enumerate(_rows(cu)):
        a = int(accepted[b])
        assert 0 <= a <= len(idx)
        assert emitted[b, :a].tolist() == draft[idx[:a]].tolist()
        assert (emitted[b, a + 1 :] == -1).all() and int(emitted[b, a]) >= 0
        for i in range(a + 1):
            assert int(emitted[b, i]) in _kept(logits[row + i], top_k)
        # A draft is accepted iff u < p(x) / q(x): check the first decision from p computed here.
        p = _profile(logits[row], temp, top_k)
        x = int(draft[idx[0]])
        assert (a >= 1) == bool(float(u[b, 0, 0]) < min(1.0, float(p[x]) / float(q[idx[0], x])))

    # The profile: renormalized softmax(logits / T) on the top-k set, zero elsewhere.
    (logits,), profile, probs = calls["apply_sampling_profile"][0]
    want = torch.stack([_profile(row, profile["temperature_milli"], profile["top_k"]) for row in logits])
    assert torch.allclose(probs.double(), want, atol=1e-6)
    assert torch.equal(probs > 0, want > 0)

    # Inverse CDF: the smallest id whose cumulative probability exceeds u.
    (probs, u), _, tokens = calls["sample_from_probs"][0]
    for i, r in enumerate(u.tolist()):
        cdf = torch.cumsum(probs[i].double(), 0)
        assert int(tokens[i]) == int((cdf <= r * cdf[-1]).sum())
        assert float(probs[i, int(tokens[i])]) > 0

    # Paged KV: each value sits at its slot (block * block_size + offset), nothing else moved,
    # and the gather returns the session's positions in order.
    (cache, values, slots), _, _ = calls["write_paged_kv"][0]
    flat = cache.view(-1, *cache.shape[2:])
    assert torch.equal(flat[slots], values)
    others = torch.ones(flat.shape[0], dtype=torch.bool)
    others[slots] = False
    assert not flat[others].any()
    (_, table, lens), _, out = calls["gather_paged_kv"][0]
    positions = torch.arange(int(lens[0]))
    want_slots = table[0, positions // cache.shape[1]].long() * cache.shape[1] + positions % cache.shape[1]
    assert torch.equal(out, flat[want_slots])
    assert torch.equal(out, values)


def _profile(row: torch.Tensor, temperature_milli: int, top_k: int) -> torch.Tensor:
    kept = torch.zeros(row.numel(), dtype=torch.bool)
    kept[list(_kept(row, top_k))] = True
    w = torch.where(kept, torch.exp((row.double() - row.double().max()) * 1000 / temperature_milli), 0.0)
    return w / w.sum()
