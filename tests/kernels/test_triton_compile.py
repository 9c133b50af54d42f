"""Every triton kernel, with the arguments its launchers pass, compiles for an H100/H200 (sm_90)
down to a cubin, on any machine: the interpreter runs Python semantics that the compiler can
still reject, and a GPU is not always at hand to find out.

The launches are recorded by running the entry points (interpreted, or on a GPU), then a
child process without TRITON_INTERPRET compiles each distinct specialization with triton's
bundled ptxas; no driver or device is needed."""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import sdcp_fast.kernels as K

from .inputs import draft, logits, ragged
from .support import backend_params, call

TRITON = backend_params("triton")
_TYPES = {torch.float32: "*fp32", torch.bfloat16: "*bf16", torch.float16: "*fp16", torch.float64: "*fp64",
          torch.int32: "*i32", torch.int64: "*i64", torch.bool: "*i1", torch.int8: "*i8"}
_COMPILE = """
import json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from sdcp_fast.triton_kernels import attention, paged_kv, sampling
for name, signature, constexprs in json.loads(sys.stdin.read()):
    module = next(m for m in (sampling, attention, paged_kv) if hasattr(m, name))
    triton.compile(ASTSource(fn=getattr(module, name), signature=signature, constexprs=constexprs),
                   target=GPUTarget("cuda", 90, 32))
    print("compiled", name, flush=True)
"""


def _ptxas() -> bool:
    try:
        import triton.backends.nvidia as nv
    except ImportError:
        return False
    return (Path(nv.__file__).parent / "bin" / "ptxas").exists()


def _record(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, dict[str, str], dict[str, Any]]]:
    from sdcp_fast.triton_kernels import attention, sampling

    seen: list[tuple[str, dict[str, str], dict[str, Any]]] = []

    class Recorder:
        def __init__(self, name: str, kernel: Any) -> None:
            self.name, self.kernel = name, kernel

        def __getitem__(self, grid: Any) -> Any:
            def launch(*args: Any, **kwargs: Any) -> Any:
                fn = getattr(self.kernel, "fn", self.kernel)
                names = list(inspect.signature(fn).parameters)
                params = inspect.signature(fn).parameters
                bound = dict(zip(names, args, strict=False)) | kwargs
                signature: dict[str, str] = {}
                constexprs: dict[str, Any] = {}
                for arg, value in bound.items():
                    if "constexpr" in str(params[arg].annotation):
                        signature[arg] = "constexpr"
                        constexprs[arg] = value
                    elif isinstance(value, torch.Tensor):
                        signature[arg] = _TYPES[value.dtype]
                    elif isinstance(value, bool):
                        signature[arg] = "i1"
                    elif isinstance(value, int):
                        signature[arg] = "i32" if -2**31 <= value < 2**31 else "i64"
                    else:
                        signature[arg] = "fp32"
                entry = (self.name, signature, constexprs)
                if entry not in seen:
                    seen.append(entry)
                return self.kernel[grid](*args, **kwargs)

            return launch

    for name in ("row_partials_kernel", "profile_write_kernel", "sample_kernel", "greedy_kernel",
                 "speculative_kernel"):
        monkeypatch.setattr(sampling, name, Recorder(name, getattr(sampling, name)))
    monkeypatch.setattr(attention, "paged_attention_kernel",
                        Recorder("paged_attention_kernel", attention.paged_attention_kernel))
    return seen


@pytest.mark.slow
@pytest.mark.skipif(not _ptxas(), reason="triton's nvidia backend (bundled ptxas) is not installed")
@pytest.mark.parametrize("backend", TRITON)
def test_every_launch_compiles_for_sm90(backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _record(monkeypatch)
    gen = torch.Generator().manual_seed(0)
    ms = [2, 1, 3]
    x = logits(gen, sum(ms) + len(ms), 300)
    q, tokens = draft(gen, torch.softmax(x.double(), 1), ms, "close")
    u = torch.rand(len(ms), 4, 2, generator=gen, dtype=torch.float64)
    for prof in ((None, None, None), (700, 20, 900), (torch.tensor([0, 700, 1000]), torch.tensor([0, 5, 0]),
                                                       torch.tensor([0, 0, 500]))):
        call(K.verify_speculative, x, *prof, q, tokens, ragged(ms), u, backend=backend)
        call(K.verify_speculative, x.bfloat16(), *prof, q, tokens, ragged(ms), u, backend=backend)
    call(K.verify_greedy, x, tokens, ragged(ms), backend=backend)
    probs = call(K.apply_sampling_profile, x, 700, 20, 900, backend=backend)
    call(K.apply_sampling_profile, x, backend=backend)
    call(K.sample_from_probs, probs, torch.rand(x.shape[0], dtype=torch.float64), backend=backend)
    for dtype in (torch.float32, torch.bfloat16):  # a Llama-3.2-1B-shaped layer: 32 heads on 8, D = 64
        cache = torch.zeros(4, 16, 8, 64, dtype=dtype)
        call(K.paged_attention, torch.zeros(3, 32, 64, dtype=dtype), cache, cache,
             torch.tensor([[0, 1], [2, 3]], dtype=torch.int32), torch.tensor([20, 5], dtype=torch.int32),
             torch.tensor([0, 2, 3]), backend=backend)
    assert {name for name, _, _ in seen} == {"row_partials_kernel", "profile_write_kernel", "sample_kernel",
                                             "greedy_kernel", "speculative_kernel", "paged_attention_kernel"}
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", _COMPILE], input=json.dumps(seen), capture_output=True, text=True,
                          env=env, timeout=900, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    assert done.stdout.count("compiled") == len(seen)
