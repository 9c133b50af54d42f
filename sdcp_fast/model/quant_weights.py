"""``--weights``: which form the target's (and a draft's) linear layers take on the CPU.

- ``f32`` / ``bf16``: float weights, torch matmuls (a GGUF is dequantized at load).
- ``q8_0``: every linear layer in Q8_0 blocks (a GGUF's Q8_0 blocks kept; anything else
  rounded from its float values).
- ``q4``: a GGUF's Q4_0, Q4_1 and Q8_0 blocks kept byte for byte (what llama.cpp multiplies
  by); float and other block formats (K-quants, F16) rounded to Q4_1.
- ``auto``: ``q4`` for a GGUF on the CPU when the native kernels are built (the file's own
  blocks: no value changes), else ``f32``.

The quantized layers multiply with :func:`sdcp_fast.kernels.quant.quant_matmul` (activations
rounded to int8 blocks, as llama.cpp does). The embedding stays float (rows are gathered,
not multiplied); a tied output head gets its own quantized copy of the embedding's blocks.
A quantized model's ``state_dict`` holds the dequantized weights, so its weights digest
(§4.1) names the values it multiplies by.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from sdcp_fast import native
from sdcp_fast.kernels.quant import QuantWeight, dequantize, quant_matmul, quantize

from . import loader, weights
from .llama import Transformer

WEIGHTS = ("auto", "f32", "bf16", "q8_0", "q4")
_GGUF_KINDS = {"Q8_0": "q8_0", "Q4_0": "q4_0", "Q4_1": "q4_1"}


class QuantLinear(nn.Module):
    """``y = x W^T + b`` with ``W`` in quantized blocks; float32 out (cast to ``x``'s dtype)."""

    def __init__(self, w: QuantWeight, bias: torch.Tensor | None = None, *, in_state: bool = True) -> None:
        super().__init__()
        self.qweight = w
        self.in_state = in_state  # False: a copy of another tensor (a tied head), left out of state_dict
        self.in_features, self.out_features = w.k, w.n
        self.register_buffer("blocks", w.blocks, persistent=False)
        self.bias = None if bias is None else nn.Parameter(bias.detach().float(), requires_grad=False)
        self._register_state_dict_hook(_dequantized_state)

    @property
    def weight(self) -> torch.Tensor:
        """The dequantized weight (computed on each access: for inspection, not for passes)."""
        return dequantize(self.qweight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = quant_matmul(x if x.dtype == torch.float32 else x.float(), self.qweight)
        if self.bias is not None:
            y = y + self.bias
        return y if x.dtype == torch.float32 else y.to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.in_features}, {self.out_features}, {self.qweight.kind}, bias={self.bias is not None}"


def _dequantized_state(module: QuantLinear, state: dict[str, Any], prefix: str, _meta: Any) -> None:
    if module.in_state:
        state[prefix + "weight"] = dequantize(module.qweight)
    else:
        for key in [k for k in state if k.startswith(prefix)]:
            del state[key]


def resolve(choice: str, path: Path | None, device: str = "cpu") -> str:
    """The concrete form ``auto`` stands for (others are returned as they are)."""
    if choice not in WEIGHTS:
        raise ValueError(f"--weights must be one of {', '.join(WEIGHTS)}, not {choice!r}")
    if choice != "auto":
        return choice
    gguf_file = path is not None and path.suffix == ".gguf"
    return "q4" if gguf_file and device == "cpu" and native.available() else "f32"


def load(spec: str | os.PathLike[str], choice: str = "f32", *, borrow: Transformer | None = None,
         device: str = "cpu") -> loader.LoadedModel:
    """:func:`loader.load` with the linear layers in the form ``choice`` names; the form
    used is recorded in ``meta["weights"]``."""
    path = loader.resolve(spec)
    form = resolve(choice, path, device)
    if form in ("q8_0", "q4") and device != "cpu":
        raise ValueError(f"--weights {form} runs on the CPU only (use f32 or bf16 on {device})")
    lm = loader.load(spec, torch.bfloat16 if form == "bf16" else torch.float32, borrow=borrow)
    if form in ("q8_0", "q4"):
        blocks = gguf_blocks(path) if path.suffix == ".gguf" else {}
        quantize_model(lm.model, form, blocks)
    lm.meta["weights"] = form
    return lm


def gguf_blocks(path: Path) -> dict[str, QuantWeight]:
    """Our tensor name -> the file's blocks, for the tensors stored as Q8_0, Q4_0 or Q4_1
    (rows in our q/k order: llama.cpp's rope permutation undone on whole block rows)."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    arch = str(reader.fields["general.architecture"].contents())
    heads = {k: int(reader.fields[f"{arch}.attention.{k}"].contents())
             for k in ("head_count", "head_count_kv") if f"{arch}.attention.{k}" in reader.fields}
    out: dict[str, QuantWeight] = {}
    for t in reader.tensors:
        ours = weights.from_gguf_name(t.name)
        kind = _GGUF_KINDS.get(t.tensor_type.name)
        if ours is None or kind is None or not ours.endswith("weight"):
            continue
        raw = torch.from_numpy(t.data.copy())  # [N, row bytes]
        if arch == "llama" and ours.endswith("attn.wq.weight"):
            raw = weights.unpermute_rope(raw, heads["head_count"])
        elif arch == "llama" and ours.endswith("attn.wk.weight"):
            raw = weights.unpermute_rope(raw, heads.get("head_count_kv", heads["head_count"]))
        k = int(t.shape[0])
        out[ours] = QuantWeight(kind, raw.contiguous(), raw.shape[0], k)
    return out


def _quant_of(name: str, w: torch.Tensor, form: str, blocks: dict[str, QuantWeight]) -> QuantWeight:
    have = blocks.get(name)
    if have is not None and (have.kind == "q8_0" or form == "q4") and tuple(w.shape) == (have.n, have.k):
        return have
    return quantize(w, "q8_0" if form == "q8_0" else "q4_1")


def quantize_model(model: Transformer, form: str, blocks: dict[str, QuantWeight] | None = None) -> Transformer:
    """Replace every linear layer of ``model``'s blocks (and its output head) by a
    :class:`QuantLinear` of ``form`` (``q8_0`` or ``q4``), in place. ``blocks``: a GGUF's
    own blocks by our tensor name (:func:`gguf_blocks`), used where ``form`` keeps them.
    Layers whose input width is not a multiple of 32 stay float."""
    if form not in ("q8_0", "q4"):
        raise ValueError(f"form must be q8_0 or q4, not {form!r}")
    blocks = blocks or {}
    for prefix, mod in list(model.layers.named_modules(prefix="layers")):
        for child, lin in list(mod.named_children()):
            if isinstance(lin, nn.Linear) and lin.in_features % 32 == 0:
                name = f"{prefix}.{child}.weight"
                setattr(mod, child, QuantLinear(_quant_of(name, lin.weight, form, blocks), lin.bias))
    if model.head_ids is None and model.cfg.dim % 32 == 0:
        head = "embed.weight" if model.lm_head is None else "lm_head.weight"
        model.quant_head = QuantLinear(_quant_of(head, model.head_weight(), form, blocks), in_state=False)
    return model
