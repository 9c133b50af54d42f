"""``--weights``: which form the target's (and a draft's) linear layers take on the CPU.

- ``f32`` / ``bf16``: float weights, torch matmuls (a GGUF is dequantized at load).
- ``q8_0``: every linear layer in Q8_0 blocks (a GGUF's Q8_0 blocks kept; anything else
  rounded from its float values).
- ``q4``: a GGUF's Q4_0, Q4_1 and Q8_0 blocks kept byte for byte (what llama.cpp multiplies
  by); float and other block formats (K-quants, F16) rounded to Q4_1.
- ``auto``: ``q4`` for a GGUF on the CPU where the native kernels are built and the CPU has
  AVX2 (the file's own blocks, what llama.cpp multiplies by; the fastest form there), else
  ``f32`` (a float checkpoint keeps its values; without the native build the torch reference
  products would be slower than f32). A quantized default is exact because every part of a CPU
  pass is row-invariant (:mod:`.cpu_pass`): int8-rounded activations would otherwise turn the
  ~1e-5 rounding differences between an (M + 1)-row and a one-row pass into whole int8 steps
  and flip near-tied greedy choices, so rule 1's output would not always equal target-only
  decoding of the same weights.

The quantized layers multiply with :func:`sdcp_fast.kernels.quant.quant_matmul` (activations
rounded to int8 blocks, as llama.cpp does). A layer keeps its blocks only in the packed layout
the products read (:func:`sdcp_fast.kernels.quant.pack`, the same bytes reordered, so 8 output
rows are multiplied at once); the GGUF blocks are unpacked from it when asked for. The
embedding stays float (rows are gathered, not multiplied); a tied output head gets its own quantized copy of the embedding's blocks.
A quantized model's ``state_dict`` holds the dequantized weights, so its weights digest
(§4.1) names the values it multiplies by.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from sdcp_fast.kernels.quant import PackedWeight, QuantWeight, dequantize, launcher, pack, quantize, unpack

from . import loader, weights
from .llama import Transformer

WEIGHTS = ("auto", "f32", "bf16", "q8_0", "q4")
_GGUF_KINDS = {"Q8_0": "q8_0", "Q4_0": "q4_0", "Q4_1": "q4_1"}


class QuantLinear(nn.Module):
    """``y = x W^T + b`` with ``W`` in quantized blocks; float32 out (cast to ``x``'s dtype)."""

    def __init__(self, w: QuantWeight | PackedWeight, bias: torch.Tensor | None = None, *, in_state: bool = True,
                 parts: list[tuple[str, int]] | None = None) -> None:
        super().__init__()
        self.packed_weight = w if isinstance(w, PackedWeight) else pack(w)  # the only copy of the blocks
        self.in_state = in_state  # False: a copy of another tensor (a tied head), left out of state_dict
        # Rows of several layers fused into one product (q|k|v, gate|up): their names and row
        # counts, so that state_dict still holds each layer's own tensors.
        self.parts = parts
        self._run = launcher(self.packed_weight)
        self.in_features, self.out_features = w.k, w.n
        self.register_buffer("packed", self.packed_weight.data, persistent=False)
        self.bias = None if bias is None else nn.Parameter(bias.detach().float(), requires_grad=False)
        self._register_state_dict_hook(_dequantized_state)

    @property
    def qweight(self) -> QuantWeight:
        """The blocks in GGUF's layout (unpacked on each access: for inspection, not for passes)."""
        return unpack(self.packed_weight)

    @property
    def weight(self) -> torch.Tensor:
        """The dequantized weight (computed on each access: for inspection, not for passes)."""
        return dequantize(self.qweight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self._run(x.reshape(-1, self.in_features).float())
        if self.bias is not None:
            y = y + self.bias
        y = y.view(*x.shape[:-1], self.out_features)
        return y if x.dtype == torch.float32 else y.to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.in_features}, {self.out_features}, {self.packed_weight.kind}, bias={self.bias is not None}"


def _dequantized_state(module: QuantLinear, state: dict[str, Any], prefix: str, _meta: Any) -> None:
    if not module.in_state:
        for key in [k for k in state if k.startswith(prefix)]:
            del state[key]
    elif module.parts is None:
        state[prefix + "weight"] = dequantize(module.qweight)
    else:
        parent = prefix[: prefix[:-1].rfind(".") + 1]  # "layers.0.attn.wqkv." -> "layers.0.attn."
        weight, bias = dequantize(module.qweight), state.pop(prefix + "bias", None)
        start = 0
        for name, rows in module.parts:
            state[f"{parent}{name}.weight"] = weight[start:start + rows]
            if bias is not None:
                state[f"{parent}{name}.bias"] = bias[start:start + rows]
            start += rows


def resolve(choice: str, path: Path | None, device: str = "cpu") -> str:
    """The concrete form ``auto`` stands for (others are returned as they are)."""
    if choice not in WEIGHTS:
        raise ValueError(f"--weights must be one of {', '.join(WEIGHTS)}, not {choice!r}")
    if choice != "auto":
        return choice
    return "q4" if device == "cpu" and path is not None and path.suffix == ".gguf" and _fast_cpu() else "f32"


def _fast_cpu() -> bool:
    """The quantized products and the row-invariant pass run natively, with AVX2 or better."""
    from sdcp_fast.kernels import quant, rowwise

    return rowwise.available() and quant.isa() in ("avx2", "avx512")


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
        ours = weights.from_gguf_name(t.name, arch)
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


def quantize_model(model: Transformer, form: str, blocks: dict[str, QuantWeight] | None = None, *,
                   fuse: bool = True) -> Transformer:
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
    for block in model.layers if fuse else []:
        # One product for q|k|v and one for gate|up where the model has the fused layout
        # (each output row is computed alone, so fusing changes no value, only the call count).
        if getattr(block.attn, "fused", True) is False:
            _fuse(block.attn, ("wq", "wk", "wv"), "wqkv")
        if getattr(block.ffn, "fused", True) is False:
            _fuse(block.ffn, ("w_gate", "w_up"), "w_gate_up")
    if model.head_ids is None and model.cfg.dim % 32 == 0:
        head = "embed.weight" if model.lm_head is None else "lm_head.weight"
        model.quant_head = QuantLinear(_quant_of(head, model.head_weight(), form, blocks), in_state=False)
    return model


def _fuse(mod: nn.Module, names: tuple[str, ...], fused: str) -> None:
    parts = [getattr(mod, n, None) for n in names]
    if not all(isinstance(p, QuantLinear) and p.parts is None for p in parts):
        return
    lin = [p for p in parts if isinstance(p, QuantLinear)]
    if len({(p.packed_weight.kind, p.in_features, p.bias is None) for p in lin}) != 1:
        return
    w = QuantWeight(lin[0].packed_weight.kind, torch.cat([p.qweight.blocks for p in lin]),
                    sum(p.out_features for p in lin), lin[0].in_features)
    bias = None if lin[0].bias is None else torch.cat([p.bias for p in lin if p.bias is not None])
    for n in names:
        delattr(mod, n)
    setattr(mod, fused, QuantLinear(w, bias, parts=[(n, p.out_features) for n, p in zip(names, lin, strict=True)]))
    mod.fused = True
