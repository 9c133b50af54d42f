"""Build the optional native extension ``sdcp_fast._C`` from ``csrc/``.

All metadata lives in pyproject.toml. The extension is optional: when the C++
build fails, the package still installs and the kernels fall back to the torch
reference (``sdcp_fast.native.status()`` says why). Set SDCP_REQUIRE_NATIVE=1 to
turn a failed build into an error (CI does).

A second optional extension, ``sdcp_fast._h2`` (HTTP/2 framing and HPACK in nghttp2, from
``csrc/nghttp2/``), is built only where pkg-config finds libnghttp2 (Debian: libnghttp2-dev);
without it the transport uses the pure-Python h2 (``sdcp_fast.transport.h2native.status()``
says why). SDCP_REQUIRE_NATIVE_H2=1 makes its absence an error (CI sets it).
The native I/O server ``sdcp_fast._nio`` (``csrc/native_io/``) also needs OpenSSL's headers
(Debian: libssl-dev); SDCP_REQUIRE_NATIVE_H2=1 makes a failed build of it an error too.

A third, ``sdcp_fast.protocol._cbor_native`` (the strict CBOR codec, from ``csrc/cbor/``), is
optional like ``_C``: without it ``sdcp_fast.protocol.cbor`` uses its Python codec
(``cbor.status()`` says why); SDCP_REQUIRE_NATIVE=1 makes a failed build an error.
"""

import glob
import os
import subprocess
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
            if ext.name == "sdcp_fast._h2":
                if os.environ.get("SDCP_REQUIRE_NATIVE_H2") == "1":
                    raise
                sys.stderr.write(f"warning: sdcp_fast._h2 not built ({exc}); HTTP/2 uses the pure-Python h2\n")
                return
            if ext.name == NIO_EXT:
                if os.environ.get("SDCP_REQUIRE_NATIVE_H2") == "1":
                    raise
                sys.stderr.write(f"warning: {NIO_EXT} not built ({exc}); the role servers use the pure-Python path\n")
                return
            if ext.name == CBOR_EXT:
                if os.environ.get("SDCP_REQUIRE_NATIVE") == "1":
                    raise
                sys.stderr.write(f"warning: {CBOR_EXT} not built ({exc}); CBOR uses the Python codec\n")
                return
            self._skip(exc)

    def _skip(self, exc):
        if os.environ.get("SDCP_REQUIRE_NATIVE") == "1":
            raise exc
        sys.stderr.write(f"warning: native extension sdcp_fast._C not built ({exc}); "
                         "the torch reference backend will be used\n")


CBOR_EXT = "sdcp_fast.protocol._cbor_native"
NIO_EXT = "sdcp_fast._nio"
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
    # The strict CBOR codec of sdcp_fast/protocol/cbor.py, inside the protocol package (which
    # imports nothing else of ours); needs no library, so it is built wherever _C is.
    ext_modules.append(
        Pybind11Extension(
            CBOR_EXT,
            sorted(glob.glob("csrc/cbor/*.cpp")),
            extra_compile_args=["-O2"],
            cxx_std=17,
        )
    )


def _pkg_flags(*packages):
    """pkg-config's compile and link flags for ``packages``, or None where one is not installed."""
    try:
        cflags = subprocess.run(["pkg-config", "--cflags", *packages], capture_output=True, text=True, check=True)
        libs = subprocess.run(["pkg-config", "--libs", *packages], capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return cflags.stdout.split(), libs.stdout.split()


nghttp2 = _pkg_flags("libnghttp2") if Pybind11Extension is not None else None
if nghttp2 is not None:
    ext_modules.append(
        Pybind11Extension(
            "sdcp_fast._h2",
            ["csrc/nghttp2/h2_session.cpp"],
            extra_compile_args=["-O2", *nghttp2[0]],
            extra_link_args=nghttp2[1],
            cxx_std=17,
        )
    )
elif os.environ.get("SDCP_REQUIRE_NATIVE_H2") == "1":
    sys.exit("SDCP_REQUIRE_NATIVE_H2=1 but libnghttp2 was not found by pkg-config (Debian: libnghttp2-dev)")
else:
    sys.stderr.write("note: libnghttp2 not found (pkg-config); sdcp_fast._h2 not built, HTTP/2 uses the pure-Python h2\n")

# The native I/O server (sockets, TLS and HTTP/2 in one C++ thread), optional like _h2.
native_io = _pkg_flags("libnghttp2", "openssl") if Pybind11Extension is not None else None
if native_io is not None:
    ext_modules.append(
        Pybind11Extension(
            NIO_EXT,
            sorted(glob.glob("csrc/native_io/*.cpp")),
            extra_compile_args=["-O2", "-pthread", *native_io[0]],
            extra_link_args=["-pthread", *native_io[1]],
            cxx_std=17,
        )
    )
else:
    sys.stderr.write(f"note: libnghttp2 or OpenSSL not found (pkg-config); {NIO_EXT} not built, "
                     "the role servers use the pure-Python path\n")

setup(
    packages=[*find_packages(include=["sdcp_fast", "sdcp_fast.*"]), "sdcp_fast.triton_kernels"],
    # The @triton.jit bodies live in the top-level triton_kernels/ folder but install
    # under our namespace: a top-level "triton_kernels" package already exists on PyPI.
    package_dir={"sdcp_fast.triton_kernels": "triton_kernels"},
    package_data={"sdcp_fast": ["py.typed", "data/**/*"]},
    ext_modules=ext_modules,
    cmdclass={"build_ext": OptionalBuildExt},
)
