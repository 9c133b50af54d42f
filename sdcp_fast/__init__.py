"""sdcp_fast: an engine for the Speculative Decoding Coordination Protocol (SDCP).

Importing the package is cheap and needs neither a GPU nor the native extension:
backends load lazily (see :mod:`sdcp_fast.native`).
"""

__version__ = "0.1.0"
