"""Lazy access to the optional C++ extension ``sdcp_fast._C``.

A source checkout without a build, or a machine without a compiler, still imports
sdcp_fast; the first caller that needs the native backend gets one clear reason.

Also how the kernels' OpenMP threads wait (:func:`wait_passively`), set on importing sdcp_fast.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import MutableMapping
from types import ModuleType


class NativeUnavailable(ImportError):
    """The native extension is not built or cannot be loaded."""


@functools.cache
def _load() -> tuple[ModuleType | None, str]:
    try:
        return importlib.import_module("sdcp_fast._C"), "loaded"
    except ImportError as exc:
        return None, (
            f"native backend sdcp_fast._C is missing ({exc}); build it with "
            "`pip install -e .` (needs a C++17 compiler with OpenMP) - using the torch reference meanwhile"
        )


def available() -> bool:
    return _load()[0] is not None


def status() -> str:
    """One line: 'loaded' or why the native backend is missing."""
    return _load()[1]


def module() -> ModuleType:
    """The loaded extension, or :class:`NativeUnavailable` with the reason."""
    mod, why = _load()
    if mod is None:
        raise NativeUnavailable(why)
    return mod


# Either of these says how OpenMP threads wait: a choice the user made stands.
WAIT_KNOBS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")


def wait_passively(environ: MutableMapping[str, str]) -> bool:
    """Set ``OMP_WAIT_POLICY=PASSIVE`` in ``environ`` unless it names a wait already; True when set.

    A pass is a few hundred short parallel regions with Python between them. libgomp's default
    keeps a team's threads spinning some 300,000 iterations after each region, so with two
    threads the second one burns a core through every gap, and on a busy machine a spinning
    thread is descheduled in turn while its partner waits at the barrier: a token then costs
    many times its CPU and wall time. Waiting passively costs a futex wake-up per region.
    libgomp reads its environment once, when ``import torch`` loads it, so this runs when
    sdcp_fast is imported (before anything of ours imports torch); a process that imported
    torch first keeps libgomp's defaults.
    """
    if any(knob in environ for knob in WAIT_KNOBS):
        return False
    environ["OMP_WAIT_POLICY"] = "PASSIVE"
    return True
