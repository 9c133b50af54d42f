"""Backends under test: every backend that can run here, each compared with the reference.

The triton backend runs on CPU tensors through triton's interpreter, so TRITON_INTERPRET
is set before anything imports triton (the interpreter is chosen at decoration time).
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
