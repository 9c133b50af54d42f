"""sdcp_fast: an engine for the Speculative Decoding Coordination Protocol (SDCP).

Importing the package is cheap and needs neither a GPU nor the native extension:
backends load lazily (see :mod:`sdcp_fast.native`). Importing it first sets how the CPU
kernels' OpenMP threads wait, before torch loads libgomp (:func:`sdcp_fast.native.wait_passively`).
"""

import os

from sdcp_fast import native

native.wait_passively(os.environ)

__version__ = "0.1.0"
