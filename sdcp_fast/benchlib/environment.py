"""Where a report was measured: versions, CPU and GPU, the load of the machine, the models'
digests and the git commit, so that no figure travels without its setting."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any


def _git(args: list[str]) -> str | None:
    root = Path(__file__).resolve().parents[2]
    try:
        out = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _versions() -> dict[str, str | None]:
    from importlib.metadata import PackageNotFoundError, version

    out: dict[str, str | None] = {}
    for name in ("sdcp-fast", "torch", "numpy", "h2", "transformers", "triton", "matplotlib"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    return out


def environment(models: dict[str, bytes] | None = None) -> dict[str, Any]:
    import torch

    gpu = None
    if torch.cuda.is_available():
        gpu = {"name": torch.cuda.get_device_name(0), "count": torch.cuda.device_count(),
               "cuda": torch.version.cuda}
    dirty = _git(["status", "--porcelain", "--untracked-files=no"])
    return {
        "python": sys.version.split()[0], "platform": platform.platform(), "versions": _versions(),
        "cpu": _cpu(), "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "gpu": gpu,
        "git": {"commit": _git(["rev-parse", "HEAD"]), "dirty": bool(dirty) if dirty is not None else None},
        "models": {k: v.hex() for k, v in (models or {}).items()},
        "argv": sys.argv,
    }
