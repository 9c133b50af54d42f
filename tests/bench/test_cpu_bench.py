"""bench/cpu.py's smallest run in CI, on a shipped float checkpoint: every section reports,
and an absent peer (llama.cpp for a non-GGUF model; transformers when it is not installed)
is named with the reason it was skipped. Speed itself is never asserted."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "cpu.py"


def _bench():
    spec = importlib.util.spec_from_file_location("bench_cpu", BENCH)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_smallest_run_reports_every_section_and_why_peers_were_skipped(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    bench = _bench()
    out = tmp_path / "cpu.json"
    assert bench.main(["--model", "tiny-target", "--weights", "q8_0,f32", "--threads", "1", "--repeats", "1",
                       "--tokens", "4", "--prefill", "16", "--skip-hf", "--drafters", "ngram", "--spec-prompts", "1",
                       "--out", str(out)]) == 0
    text = capsys.readouterr().out
    got = json.loads(out.read_text())
    assert set(got["decode"]["1"]) == {"ours q8_0", "ours f32"}
    assert set(got["pass_ratio"]["1"]) == {"ours q8_0", "ours f32"} and got["speculation"]["q8_0"]["ngram"]
    assert any(n.startswith("llama.cpp skipped: ") for n in got["notes"])
    assert "HF transformers skipped: --skip-hf" in got["notes"]
    assert "decode tokens/s" in text and "note: llama.cpp skipped" in text


def test_agreement_counts_up_to_the_first_difference() -> None:
    bench = _bench()
    assert bench.agreement([[1, 2, 3], [4, 5, 6]], [[1, 2, 9], [4, 5, 6]]) == (5, 6)
    assert bench.agreement([[1]], [[2]]) == (0, 1)
