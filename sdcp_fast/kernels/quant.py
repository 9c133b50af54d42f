"""Products with quantized weights (GGUF's Q8_0, Q4_0, Q4_1 blocks): the C++ kernels of
``csrc/quant_kernels.cpp`` (``cpu``) and their plain-torch definition
(``reference``, :mod:`.quant_reference`).

``quant_matmul(x, w)`` multiplies float32 activations ``[..., K]`` by a
:class:`QuantWeight` ``[N, K]`` (GGUF's layout) or a :class:`PackedWeight` (:func:`pack`: the
layout the C++ products read, what a model keeps) transposed; the ``cpu`` backend packs a
:class:`QuantWeight` first (once in :func:`launcher`, on every call in :func:`quant_matmul`). Both backends quantize the activations to int8
blocks first (see :mod:`.quant_reference`); they agree to float32 rounding. Each output
row depends only on its own input row, so a pass over several positions gives each position
what a one-position pass gives it (bit for bit within one backend and instruction set).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from sdcp_fast import native

from . import quant_reference as ref
from .quant_reference import (
    BLOCK,
    BLOCK_BYTES,
    QUANT_KINDS,
    PackedWeight,
    QuantWeight,
    dequantize,
    pack,
    quantize,
    unpack,
)

__all__ = ["BLOCK", "BLOCK_BYTES", "QUANT_KINDS", "PackedWeight", "QuantWeight", "dequantize", "isa", "isas",
           "launcher", "pack", "quant_matmul", "quantize", "unpack", "use_isa"]

QUANT_BACKENDS = ("auto", "reference", "cpu")


def isas() -> list[str]:
    """Instruction sets the quantized kernels can use on this CPU, most portable first
    (``avx512`` needs AVX-512 VNNI)."""
    return list(native.module().quant_isas())


def isa() -> str:
    return str(native.module().quant_isa())


def use_isa(name: str) -> None:
    """Switch later calls, process-wide, to ``name`` (one of :func:`isas`); for tests and benchmarks."""
    if not native.module().set_quant_isa(name):
        raise ValueError(f"instruction set {name!r} is not one of {isas()}")


def _backend(name: str) -> str:
    if name not in QUANT_BACKENDS:
        raise ValueError(f"backend must be one of {QUANT_BACKENDS}, not {name!r}")
    if name == "auto":
        return "cpu" if native.available() else "reference"
    if name == "cpu" and not native.available():
        raise native.NativeUnavailable(native.status())
    return name


def quant_matmul(x: torch.Tensor, w: QuantWeight | PackedWeight, *, backend: str = "auto",
                 threads: int | None = None) -> torch.Tensor:
    """float32 ``[..., N]`` = ``x`` ``[..., K]`` times ``w`` transposed. ``threads``: CPU
    threads of the ``cpu`` backend (default: torch's intra-op count)."""
    if x.shape[-1] != w.k:
        raise ValueError(f"x has {x.shape[-1]} columns, the weight {w.k}")
    lead = x.shape[:-1]
    flat = x.reshape(-1, w.k)
    if _backend(backend) == "reference":
        return ref.quant_matmul(flat, w).reshape(*lead, w.n)
    packed = w if isinstance(w, PackedWeight) else pack(w)
    if x.device.type != "cpu" or packed.data.device.type != "cpu":
        raise ValueError("the cpu backend multiplies host tensors only")
    flat = flat.to(torch.float32).contiguous()
    data = packed.data.contiguous()
    out = torch.empty(flat.shape[0], w.n, dtype=torch.float32)
    native.module().quant_matmul(QUANT_KINDS[w.kind], data.data_ptr(), w.n, w.k, flat.data_ptr(), flat.shape[0],
                                 out.data_ptr(), threads or torch.get_num_threads())
    return out.reshape(*lead, w.n)


def launcher(w: QuantWeight | PackedWeight, *, backend: str = "auto") -> Callable[[torch.Tensor], torch.Tensor]:
    """``f(x)`` = ``quant_matmul(x, w)`` for float32 host ``x`` ``[T, K]``, with the checks on
    ``w`` done once here: a model calls it once per layer per pass, where the per-call cost
    of :func:`quant_matmul`'s checks is a visible share of a one-token pass."""
    if _backend(backend) == "reference":
        return lambda x: ref.quant_matmul(x, w)
    packed = w if isinstance(w, PackedWeight) else pack(w)
    if packed.data.device.type != "cpu" or not packed.data.is_contiguous():
        raise ValueError("the cpu backend needs contiguous host blocks")
    run, kind, n, k, blocks = native.module().quant_matmul, QUANT_KINDS[w.kind], w.n, w.k, packed.data
    empty, threads = torch.empty, torch.get_num_threads

    def call(x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.float32 or x.device.type != "cpu" or x.dim() != 2 or x.shape[1] != k:
            raise ValueError(f"expected float32 host activations [T, {k}], got {x.dtype} {tuple(x.shape)}")
        x = x.contiguous()
        out = empty(x.shape[0], n)
        run(kind, blocks.data_ptr(), n, k, x.data_ptr(), x.shape[0], out.data_ptr(), threads())
        return out

    return call
