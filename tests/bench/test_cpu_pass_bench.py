"""bench/cpu_pass.py's smallest run: every path reports a ratio per M for each form, llama.cpp
is named with the reason it was skipped, and its column and the bound table come out right
with a stand-in for it (speed is never asserted)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from sdcp_fast import native
from sdcp_fast.kernels import rowwise

BENCH = Path(__file__).resolve().parents[2] / "bench" / "cpu_pass.py"


def _bench():
    spec = importlib.util.spec_from_file_location("bench_cpu_pass", BENCH)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


@pytest.mark.skipif(not rowwise.available(), reason=native.status())
def test_smallest_run_reports_both_paths_and_why_llama_cpp_was_skipped(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "pass.json"
    assert _bench().main(["--model", "tiny-target", "--weights", "q8_0,f32", "--context", "8", "--reps", "1",
                          "--m", "1,4", "--out", str(out)]) == 0
    got = json.loads(out.read_text())
    assert set(got["forms"]) == {"q8_0", "f32"}
    for form in got["forms"].values():
        assert set(form) == {"native", "torch"}
        assert set(form["native"]["ratios"]) == {"1", "4"} and form["native"]["ratio"] > 0
    assert any(n.startswith("llama.cpp skipped: ") for n in got["notes"])  # tiny-target is no GGUF
    text = capsys.readouterr().out
    assert "side by side: ours q8_0 (native)" in text and "note: llama.cpp skipped" in text
    assert "a for 1.3x" in text


class _Llama:
    """Stands in for bench/cpu.py's LlamaCpp: a pass costs 1 + (n - 1) / 2 units."""

    def __init__(self) -> None:
        self.primed: list[int] = []
        self.passes: list[list[int]] = []

    def prime(self, tokens: list[int]) -> None:
        self.primed = list(tokens)

    def pass_s(self, tokens: list[int]) -> float:
        self.passes.append(list(tokens))
        return 1 + (len(tokens) - 1) / 2


@pytest.mark.skipif(not rowwise.available(), reason=native.status())
def test_llama_cpp_column_runs_the_same_context_and_positions() -> None:
    llama = _Llama()
    got = _bench().measure("tiny-target", "f32", 6, 2, [1, 3], llama)
    assert set(got) == {"native", "torch", "llama.cpp"}
    assert got["llama.cpp"]["ratios"] == {1: 1.5, 3: 2.5}
    # The context's last token opens every pass, as ours re-runs it: 5 cached tokens, then it.
    assert len(llama.primed) == 5
    assert [len(p) for p in llama.passes] == [1, 2, 4] * 2
    assert all(p[0] == llama.passes[0][0] for p in llama.passes)


def test_bound_table_gives_the_bound_and_the_acceptance_each_goal_needs() -> None:
    lines = _bench().bound_table({"x": {1: 1.0, 4: 4.0}}, [0.5], [1.3, 1.5], 0.0)
    # M = 1 at cost 1: 1.5 tokens per pass; 1.3x needs a = 0.3, 1.5x a = 0.5.
    assert lines[2].split() == ["x", "1", "1.00", "1.50x", "0.30", "0.50"]
    # M = 4 at cost 4: at most 5 / 4 = 1.25x, so neither goal is reachable.
    assert lines[3].split() == ["x", "4", "4.00", f"{(1 - 0.5 ** 5) / 0.5 / 4:.2f}x", "-", "-"]

