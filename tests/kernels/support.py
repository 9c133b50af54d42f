"""Shared helpers of the kernel tests."""

from __future__ import annotations

import pytest
import torch

from sdcp_fast.kernels import backends


def _why_not(name: str) -> str | None:
    try:
        backends.resolve(name, torch.device("cpu"))
    except backends.BackendUnavailable as exc:
        return str(exc)
    return None


def backend_params(*names: str) -> list[object]:
    """pytest params for the named backends, each skipped with its reason when it cannot run."""
    out: list[object] = []
    for name in names:
        why = _why_not(name)
        marks = [pytest.mark.skip(reason=why)] if why else []
        out.append(pytest.param(name, id=name, marks=marks))
    return out
