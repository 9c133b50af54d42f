"""Lazy access to the optional C++ extension ``sdcp_fast._C``.

A source checkout without a build, or a machine without a compiler, still imports
sdcp_fast; the first caller that needs the native backend gets one clear reason.
"""

from __future__ import annotations

import functools
import importlib
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
