"""sdcp_fast/native.py: how the kernels' OpenMP threads wait."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from sdcp_fast import native


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in native.WAIT_KNOBS}


def test_wait_passively_unless_the_environment_names_a_wait() -> None:
    env: dict[str, str] = {}
    assert native.wait_passively(env) and env == {"OMP_WAIT_POLICY": "PASSIVE"}
    for knob, value in (("OMP_WAIT_POLICY", "ACTIVE"), ("GOMP_SPINCOUNT", "10000")):
        env = {knob: value}
        assert not native.wait_passively(env) and env == {knob: value}


def test_importing_sdcp_fast_sets_the_wait_before_torch_loads() -> None:
    code = "import os, sdcp_fast, torch; print(os.environ.get('OMP_WAIT_POLICY'))"
    out = subprocess.run([sys.executable, "-c", code], env=_clean_env(), capture_output=True, text=True,
                         check=True, timeout=300).stdout
    assert out.strip() == "PASSIVE"


# Two-thread products with the main thread asleep between them, as Python runs between the
# parallel regions of a pass: the process's CPU time while it sleeps is the OpenMP worker's.
IDLE_CPU = """
import sdcp_fast, time, torch
from sdcp_fast.kernels import quant
from sdcp_fast.kernels.quant_reference import quantize
x, w = torch.randn(1, 576), quantize(torch.randn(3072, 576), "q4_1")
idle = 0.0
for _ in range(40):
    quant.quant_matmul(x, w, backend="cpu", threads=2)
    c = time.process_time()
    time.sleep(0.02)
    idle += time.process_time() - c
print(idle)
"""


@pytest.mark.skipif(not native.available(), reason="needs the native extension (its OpenMP products)")
def test_the_worker_thread_does_not_spin_between_two_thread_products() -> None:
    out = subprocess.run([sys.executable, "-c", IDLE_CPU], env=_clean_env(), capture_output=True, text=True,
                         check=True, timeout=300).stdout
    # libgomp's default spin is 3-6 ms of CPU per gap here (0.13-0.23 s over the 40 gaps, even
    # with the cores shared ~7 ways); waiting passively it is ~1.5 ms for all 40.
    assert float(out) < 0.04
