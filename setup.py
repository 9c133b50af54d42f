"""Build the optional native extension ``sdcp_fast._C`` from ``csrc/``.

All metadata lives in pyproject.toml. The extension is optional: when the C++
build fails, the package still installs and the kernels fall back to the torch
reference (``sdcp_fast.native.status()`` says why). Set SDCP_REQUIRE_NATIVE=1 to
turn a failed build into an error (CI does).
"""

import glob
import os
import sys

from setuptools import find_packages, setup
from setuptools.command.build_ext import build_ext

try:
    from pybind11.setup_helpers import Pybind11Extension
except ImportError:  # build requirements missing: install pure Python only
    Pybind11Extension = None


class OptionalBuildExt(build_ext):
    def run(self):
        try:
            super().run()
        except Exception as exc:  # noqa: BLE001 - any compiler failure
            self._skip(exc)

    def build_extension(self, ext):
        try:
            super().build_extension(ext)
        except Exception as exc:  # noqa: BLE001
            self._skip(exc)

    def _skip(self, exc):
        if os.environ.get("SDCP_REQUIRE_NATIVE") == "1":
            raise exc
        sys.stderr.write(f"warning: native extension sdcp_fast._C not built ({exc}); "
                         "the torch reference backend will be used\n")


ext_modules = []
if Pybind11Extension is not None:
    ext_modules.append(
        Pybind11Extension(
            "sdcp_fast._C",
            sorted(glob.glob("csrc/*.cpp")),
            include_dirs=["csrc"],
            # Sources included by the .cpp files: a change to one rebuilds the extension.
            depends=sorted(glob.glob("csrc/*.h") + glob.glob("csrc/*.inc")),
            # No -march: the build runs on any x86-64 (a wheel may travel). The sampling kernels
            # carry AVX2 variants and pick one at run time from what the CPU reports.
            extra_compile_args=["-O3", "-fopenmp"],
            extra_link_args=["-fopenmp"],
            cxx_std=17,
        )
    )

setup(
    packages=[*find_packages(include=["sdcp_fast", "sdcp_fast.*"]), "sdcp_fast.triton_kernels"],
    # The @triton.jit bodies live in the top-level triton_kernels/ folder but install
    # under our namespace: a top-level "triton_kernels" package already exists on PyPI.
    package_dir={"sdcp_fast.triton_kernels": "triton_kernels"},
    package_data={"sdcp_fast": ["py.typed", "data/**/*"]},
    ext_modules=ext_modules,
    cmdclass={"build_ext": OptionalBuildExt},
)
