"""Arrivals: closed loop sends every session at once; ``--rate`` is a seeded Poisson process."""

from __future__ import annotations

import statistics

import pytest

from sdcp_fast.benchlib.workload import Workload, builtin, take


def _workload(rate: float | None, seed: int = 0) -> Workload:
    return Workload(take(builtin(toy=True), 3), 4, rate=rate, seed=seed)


def test_closed_loop_sends_every_session_at_once() -> None:
    assert _workload(None).arrivals(5) == [0.0] * 5


def test_open_loop_is_a_seeded_poisson_process() -> None:
    a = _workload(4.0).arrivals(4000)
    assert a == _workload(4.0).arrivals(4000) != _workload(4.0, seed=1).arrivals(4000)
    gaps = [y - x for x, y in zip(a, a[1:], strict=False)]
    assert a[0] == 0.0 and min(gaps) >= 0
    # exponential gaps: mean 1/rate, and standard deviation equal to the mean
    assert statistics.fmean(gaps) == pytest.approx(0.25, rel=0.08)
    assert statistics.pstdev(gaps) == pytest.approx(0.25, rel=0.1)
