"""bench/cpu_pass.py's smallest run: both paths report for each form (speed is never asserted)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from sdcp_fast import native
from sdcp_fast.kernels import rowwise

BENCH = Path(__file__).resolve().parents[2] / "bench" / "cpu_pass.py"


@pytest.mark.skipif(not rowwise.available(), reason=native.status())
def test_smallest_run_reports_both_paths(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("bench_cpu_pass", BENCH)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "pass.json"
    assert bench.main(["--model", "tiny-target", "--weights", "q8_0,f32", "--context", "8", "--reps", "1",
                       "--out", str(out)]) == 0
    got = json.loads(out.read_text())
    assert set(got) == {"q8_0", "f32"}
    assert all(set(got[f]) == {"native", "torch"} and got[f]["native"]["ratio"] > 0 for f in got)
