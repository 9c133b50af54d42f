"""Backends under test: every backend that can run here, each compared with the reference.

Without a GPU the triton backend runs on CPU tensors through triton's interpreter, so
TRITON_INTERPRET is set before anything imports triton (it is read at decoration time).
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_terminal_summary(terminalreporter) -> None:  # type: ignore[no-untyped-def]
    from .support import BOUNDARY_CASES

    if BOUNDARY_CASES:
        terminalreporter.write_line(
            f"kernels: rule 2 parity compared {len(BOUNDARY_CASES)} batches with the reference; "
            f"{sum(BOUNDARY_CASES)} sessions differed, each within 1e-6 of a decision boundary")
