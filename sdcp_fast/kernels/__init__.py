"""Kernel library: batched verification (rules 1 and 2), sampling profiles, residual
sampling and paged-KV read/write, with ``reference`` (torch), ``cpu`` (C++) and
``triton`` backends.

Stands alone: imports nothing else of sdcp_fast except the lazy native loader.
TODO(kernels): the API.
"""
