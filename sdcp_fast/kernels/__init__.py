"""Kernel library: batched verification (rules 1 and 2 of §6.4), sampling profiles (§4.1),
inverse-CDF sampling, paged-KV read/write, paged attention and products with GGUF's quantized
blocks (``quant``, its reference in ``quant_reference``), with ``reference`` (torch), ``cpu`` (C++)
and ``triton`` backends.

Stands alone: an engine that knows nothing else of sdcp_fast can import it; it imports
nothing else of ours except the lazy native loader.
"""

from .attention import paged_attention
from .backends import BACKENDS, BackendUnavailable
from .paged_kv import gather_paged_kv, write_paged_kv
from .sampling import apply_sampling_profile, sample_from_probs
from .verify import verify_greedy, verify_speculative

__all__ = [
    "BACKENDS",
    "BackendUnavailable",
    "apply_sampling_profile",
    "gather_paged_kv",
    "paged_attention",
    "sample_from_probs",
    "verify_greedy",
    "verify_speculative",
    "write_paged_kv",
]
