"""Launchers of the ``cpu`` backend: the C++ kernels of ``csrc/`` through ``sdcp_fast._C``.

Each tensor crosses as ``(data_ptr, dtype_code, shape, strides)``; the binding checks
dtypes, shapes and contiguity again before touching memory. Outputs are allocated here.
"""

from __future__ import annotations

import torch

from sdcp_fast import native

from .params import Profile, Ragged

# Must match csrc/sampling_args.h.
_CODES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2, torch.float64: 3, torch.int32: 4,
          torch.int64: 5, torch.bool: 6}


def isas() -> list[str]:
    """Instruction sets the C++ kernels can use on this CPU, most portable first."""
    return list(native.module().sampling_isas())


def isa() -> str:
    """The instruction set in use: the widest this CPU runs unless capped by the environment
    variable ``SDCP_CPU_ISA`` (scalar, avx2) or changed by :func:`use_isa`."""
    return str(native.module().sampling_isa())


def use_isa(name: str) -> None:
    """Switch every later call, process-wide, to ``name`` (one of :func:`isas`); for tests
    and benchmarks. ValueError if this CPU cannot run it."""
    native.module().sampling_set_isa(name)


def _arg(t: torch.Tensor) -> tuple[int, int, tuple[int, ...], tuple[int, ...]]:
    return (t.data_ptr(), _CODES[t.dtype], tuple(t.shape), tuple(t.stride()))


def _profile(prof: Profile) -> tuple[tuple[int, int, tuple[int, ...], tuple[int, ...]], ...]:
    return tuple(_arg(x.to("cpu", torch.int64).contiguous())
                 for x in (prof.temperature_milli, prof.top_k, prof.top_p_milli))


def apply_sampling_profile(logits: torch.Tensor, prof: Profile) -> torch.Tensor:
    probs = torch.empty(logits.shape, dtype=torch.float32)
    native.module().sampling_apply_profile(_arg(logits), *_profile(prof), _arg(probs))
    return probs


def sample_from_probs(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    tokens = torch.empty(probs.shape[0], dtype=torch.int32)
    native.module().sampling_sample_from_probs(_arg(probs), _arg(u), _arg(tokens))
    return tokens


def _outputs(lay: Ragged) -> tuple[torch.Tensor, torch.Tensor]:
    return (torch.zeros(lay.batch, dtype=torch.int32),
            torch.full((lay.batch, lay.m_max + 1), -1, dtype=torch.int32))


def verify_greedy(target_logits: torch.Tensor, draft_tokens: torch.Tensor,
                  lay: Ragged) -> tuple[torch.Tensor, torch.Tensor]:
    accepted, emitted = _outputs(lay)
    native.module().sampling_verify_greedy(_arg(target_logits), _arg(draft_tokens), _arg(lay.cu_draft),
                                           _arg(accepted), _arg(emitted))
    return accepted, emitted


def verify_speculative(target_logits: torch.Tensor, prof: Profile, q_probs: torch.Tensor | list[torch.Tensor],
                       draft_tokens: torch.Tensor, lay: Ragged,
                       u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``q_probs``: one ``[D, V]`` tensor, or a list of each session's ``[M_b, V]`` (host
    tensors), read where they lie."""
    accepted, emitted = _outputs(lay)
    bad = torch.zeros(lay.batch, dtype=torch.bool)
    q = _arg(q_probs) if isinstance(q_probs, torch.Tensor) else [_arg(t) for t in q_probs]
    native.module().sampling_verify_speculative(
        _arg(target_logits), *_profile(prof), q, _arg(draft_tokens), _arg(lay.cu_draft), _arg(u),
        _arg(accepted), _arg(emitted), _arg(bad))
    return accepted, emitted, bad


def write_paged_kv(cache: torch.Tensor, values: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    native.module().paged_kv_write(_arg(cache), _arg(values), _arg(slot_mapping))


def gather_paged_kv(cache: torch.Tensor, block_table: torch.Tensor, seq_lens: torch.Tensor) -> torch.Tensor:
    out = torch.empty((int(seq_lens.sum()), *cache.shape[2:]), dtype=cache.dtype)
    native.module().paged_kv_gather(_arg(cache), _arg(block_table), _arg(seq_lens), _arg(out))
    return out
