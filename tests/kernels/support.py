"""Shared helpers of the kernel tests."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from sdcp_fast.kernels import backends

# Rule-2 parity: sessions per compared batch that differed from the reference at a decision
# boundary (within 1e-6); conftest.py prints the totals at the end of the run.
BOUNDARY_CASES: list[int] = []


def device_of(backend: str) -> torch.device:
    """Where a backend's inputs live in these tests: CUDA for triton on a GPU, else the CPU."""
    if backend == "triton" and torch.cuda.is_available() and not backends.triton_interpreted():
        return torch.device("cuda")
    return torch.device("cpu")


def interpreted(backend: str) -> bool:
    """True when the backend is triton's (slow) CPU interpreter: tests keep its shapes small."""
    return backend == "triton" and device_of(backend).type == "cpu"


def _why_not(name: str) -> str | None:
    try:
        backends.resolve(name, device_of(name))
    except backends.BackendUnavailable as exc:
        return str(exc)
    return None


def backend_params(*names: str) -> list[Any]:
    """pytest params for the named backends, each skipped with its reason when it cannot run."""
    out: list[Any] = []
    for name in names:
        why = _why_not(name)
        marks = [pytest.mark.skip(reason=why)] if why else []
        out.append(pytest.param(name, id=name, marks=marks))
    return out


def call(fn: Callable[..., Any], *args: Any, backend: str, **kwargs: Any) -> Any:
    """fn(*args, backend=backend, **kwargs) with tensors on the backend's device; results on the CPU."""
    dev = device_of(backend)

    def there(v: Any) -> Any:
        return v.to(dev) if isinstance(v, torch.Tensor) else v

    def back(v: Any) -> Any:
        return v.cpu() if isinstance(v, torch.Tensor) else v

    out = fn(*map(there, args), backend=backend, **{k: there(v) for k, v in kwargs.items()})
    return tuple(map(back, out)) if isinstance(out, tuple) else back(out)
