"""Backend choice and lazy loading.

``auto`` picks ``triton`` for CUDA tensors and ``cpu`` (the native extension) for CPU
tensors, falling back to ``reference`` when the preferred backend cannot load; the
reason is logged once per backend, not on every call. An explicitly requested backend
that cannot load raises :class:`BackendUnavailable` with the reason.
"""

from __future__ import annotations

import functools
import importlib
import logging
import os
from typing import Protocol, cast

import torch

from sdcp_fast import native

from .params import DeviceProfile, Profile, Ragged

BACKENDS = ("auto", "reference", "cpu", "triton")
_log = logging.getLogger(__name__)


class BackendUnavailable(RuntimeError):
    """The requested backend cannot run here (missing build, no triton, wrong device)."""


@functools.cache
def _triton_reason() -> str | None:
    try:
        importlib.import_module("triton")
        importlib.import_module("sdcp_fast.triton_kernels.sampling")
    except Exception as exc:  # noqa: BLE001 - any import failure means "not available"
        return f"triton backend unavailable ({type(exc).__name__}: {exc})"
    return None


def _reason(name: str) -> str | None:
    if name == "cpu":
        if not native.available():
            return native.status()
        if not hasattr(native.module(), "paged_kv_write"):
            return "cpu backend unavailable: sdcp_fast._C predates the kernels; rebuild it with `make native`"
        return None
    if name == "triton":
        return _triton_reason()
    return None


@functools.cache
def _explain_once(name: str, why: str) -> None:
    _log.warning("sdcp_fast.kernels: %s; using the reference backend", why)


def triton_interpreted() -> bool:
    """True when triton runs its CPU interpreter (tests on machines without a GPU)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def resolve(backend: str, device: torch.device) -> str:
    """The concrete backend ("reference", "cpu" or "triton") for tensors on ``device``."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, not {backend!r}")
    if backend == "reference":
        return backend
    if backend == "auto":
        wanted = "triton" if device.type == "cuda" else "cpu" if device.type == "cpu" else "reference"
        if wanted == "reference":
            return wanted
        why = _reason(wanted)
        if why is None:
            return wanted
        _explain_once(wanted, why)
        return "reference"
    why = _reason(backend)
    if why is not None:
        raise BackendUnavailable(why)
    if backend == "cpu" and device.type != "cpu":
        raise BackendUnavailable(f"the cpu backend needs CPU tensors, got {device}")
    if backend == "triton" and device.type != "cuda" and not triton_interpreted():
        raise BackendUnavailable(f"the triton backend needs CUDA tensors (or TRITON_INTERPRET=1), got {device}")
    return backend


class Backend(Protocol):
    """What each backend module provides; inputs arrive validated by :mod:`.params` (the triton
    backend takes a :class:`DeviceProfile`, the others a :class:`Profile`)."""

    def apply_sampling_profile(self, logits: torch.Tensor, prof: Profile | DeviceProfile) -> torch.Tensor: ...

    def sample_from_probs(self, probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor: ...

    def verify_greedy(self, target_logits: torch.Tensor, draft_tokens: torch.Tensor,
                      lay: Ragged) -> tuple[torch.Tensor, torch.Tensor]: ...

    def verify_speculative(self, target_logits: torch.Tensor, prof: Profile | DeviceProfile, q_probs: torch.Tensor,
                           draft_tokens: torch.Tensor, lay: Ragged,
                           u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]: ...

    def write_paged_kv(self, cache: torch.Tensor, values: torch.Tensor, slot_mapping: torch.Tensor) -> None: ...

    def gather_paged_kv(self, cache: torch.Tensor, block_table: torch.Tensor,
                        seq_lens: torch.Tensor) -> torch.Tensor: ...


def load(name: str) -> Backend:
    """The launcher module of a concrete backend, imported on first use."""
    module = importlib.import_module(f"sdcp_fast.kernels.{name}_backend" if name != "reference"
                                     else "sdcp_fast.kernels.reference")
    return cast(Backend, module)
