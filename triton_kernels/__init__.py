"""@triton.jit bodies of sdcp_fast's GPU backend, installed as ``sdcp_fast.triton_kernels``.

Launchers live in :mod:`sdcp_fast.kernels`; importing this package needs triton.
"""
