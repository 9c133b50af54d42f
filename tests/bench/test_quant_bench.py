"""bench/quant.py's smallest runs: the per-product table has every shape and row count with its
per-row-block cost and ratio for each tree, and the pass split reports a pass and its products'
part at 1 and 5 positions (speed is never asserted)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from sdcp_fast import native
from sdcp_fast.kernels import rowwise

BENCH = Path(__file__).resolve().parents[2] / "bench" / "quant.py"


def _bench():
    spec = importlib.util.spec_from_file_location("bench_quant", BENCH)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


@pytest.mark.skipif(not native.available(), reason=native.status())
def test_product_table_has_every_shape_and_row_count() -> None:
    bench = _bench()
    bench.SHAPES = [(40, 64, "q4_1"), (16, 96, "q8_0")]  # small stand-ins for the model's shapes
    got = bench.measure(calls=1, reps=2)
    assert set(got) == {f"{n} x {k} {kind}, {r}" for n, k, kind in bench.SHAPES for r in bench.ROWS}
    assert all(len(v) == 2 and min(v) >= 0 for v in got.values())
    lines = bench.table({"a": got, "b": got}).splitlines()
    assert len(lines) == 2 + len(got) and lines[0].count("x 1 row") == 2
    assert "| 40 x 64 q4_1, 1 | " in lines[2] and lines[2].endswith("| 1.00 |")


@pytest.mark.skipif(not rowwise.available(), reason=native.status())
def test_pass_split_reports_the_products_part_at_one_and_five_positions() -> None:
    bench = _bench()
    got = bench.pass_split("tiny-target", context=8, reps=2)
    assert set(got) == {"1", "5"}
    for runs in got.values():
        assert len(runs) == 2 and all(0 < prod <= total for total, prod in runs)
    assert bench.split_table(got).count("\n") == 3
