"""A forward pass of :class:`~sdcp_fast.model.llama.Transformer` on the CPU from the
row-invariant kernels (:mod:`sdcp_fast.kernels.rowwise`; linear layers through the quantized
products of :mod:`sdcp_fast.kernels.quant` or the row-invariant float product).

Two reasons. Exactness: every row of the pass is computed from its own values alone, so a
position's hidden state (and logits) are bit-equal whether the pass holds it alone, with the
M other positions of a verification pass, or with other sessions' rows: rule 1's output then
equals target-only greedy decoding at every weight form, int8-rounded activations included.
Speed: a layer is ten native calls (norm with the residual add, one product for q|k|v, RoPE
with the cache append, attention read through the block table, the output product, norm,
gate|up, the gated activation, the down product, the next norm) and no torch op between them.

The checks of :mod:`~sdcp_fast.kernels.rowwise` run once, when a model's :class:`Plan` is
built (its weights' addresses, kinds and shapes); a pass then calls the native functions with
addresses only. The plan is rebuilt whenever a weight tensor is replaced (its address moves).
Used for float32 host passes without autograd on the gather path (``lay.attention`` None);
anything else (CUDA, bfloat16, training, the paged kernels) runs the torch modules.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
from torch import nn

from sdcp_fast import native
from sdcp_fast.kernels import rowwise
from sdcp_fast.kernels.quant import QUANT_KINDS

from .batch_layout import BatchLayout
from .kv_cache import PagedKVCache

_F32 = 4  # bytes per float32: offsets into a fused product's rows
# Multiply-adds (rows x n x k) from which a product is split over the pass's threads. A split
# costs a fork and a join: with OpenMP's passive wait a futex wake-up of the other thread and a
# sleep at the barrier, tens of microseconds on a virtual machine, more when the other core is
# busy. No product of a one-row pass wins that back: at 2 threads SmolLM2 q4's gate|up (1.8 M,
# the largest) took 49 us of CPU and 51 us wall split, 31 us unsplit; down, q|k|v and the output
# product took 1.6-2x the wall split (load 3-6). A verification pass's rows make its larger
# products split.
PARALLEL_FROM = 4_000_000


def usable(x: torch.Tensor, cache: PagedKVCache, lay: BatchLayout) -> bool:
    return (x.device.type == "cpu" and x.dtype == torch.float32 and cache.dtype == torch.float32
            and lay.attention is None and not torch.is_grad_enabled() and rowwise.available())


class _Linear:
    """One product: a quantized layer's blocks or a float32 weight, by address."""

    __slots__ = ("bias", "code", "k", "key", "n", "ptr", "quant", "tensors", "work")

    def __init__(self, mod: nn.Module, slot: str = "") -> None:
        packed = getattr(mod, "packed_weight", None)  # a QuantLinear's blocks, packed for the products
        self.quant = packed is not None
        bias = getattr(mod, "bias", None)
        if self.quant:
            w = packed.data
            self.code, self.n, self.k = QUANT_KINDS[packed.kind], packed.n, packed.k
        else:
            assert isinstance(mod, nn.Linear)
            w = mod.weight.detach()
            self.code, (self.n, self.k) = -1, w.shape
            if w.dtype != torch.float32 or not w.is_contiguous():
                raise ValueError("float layers must hold contiguous float32 weights")
        if not w.is_contiguous() or w.device.type != "cpu":
            raise ValueError("weights must be contiguous host tensors")
        self.bias = None if bias is None else bias.detach().float().contiguous()
        self.ptr = w.data_ptr()
        self.tensors = (w, self.bias)  # kept alive while the plan holds their addresses
        self.key = (slot, self.n)  # its output's buffer in a pass's _Work
        self.work = self.n * self.k  # multiply-adds per row

    def __call__(self, x: torch.Tensor, threads: int, work: _Work | None = None) -> torch.Tensor:
        """``x`` contiguous float32 ``[T, k]`` -> ``[T, n]`` (a buffer of ``work``'s, if given)."""
        out = torch.empty(x.shape[0], self.n) if work is None else work.get(self.key)
        if threads > 1 and x.shape[0] * self.work < PARALLEL_FROM:
            threads = 1
        if self.quant:
            _native().quant_matmul(self.code, self.ptr, self.n, self.k, x.data_ptr(), x.shape[0], out.data_ptr(),
                                   threads)
            return out if self.bias is None else out.add_(self.bias)
        _native().rw_linear_f32(x.data_ptr(), x.shape[0], self.k, self.ptr, self.n,
                                0 if self.bias is None else self.bias.data_ptr(), out.data_ptr(), threads)
        return out


def _native():  # type: ignore[no-untyped-def]
    return native.module()


class _Work:
    """One pass's intermediate buffers, ``[rows, width]`` each, by (slot, width): every layer
    reuses the previous layer's, since a layer's outputs are consumed before the next layer
    writes them (a layer's last output, the next delta, is added into the residual stream
    first of all). An allocation per product and per layer cost more than the small products."""

    __slots__ = ("bufs", "rows")

    def __init__(self, rows: int) -> None:
        self.rows = rows
        self.bufs: dict[tuple[str, int], torch.Tensor] = {}

    def get(self, key: tuple[str, int]) -> torch.Tensor:
        buf = self.bufs.get(key)
        if buf is None:
            buf = self.bufs[key] = torch.empty(self.rows, key[1])
        return buf


class _Norm:
    __slots__ = ("eps", "ptr", "unit", "w")

    def __init__(self, norm: nn.Module) -> None:
        self.w = norm.weight.detach().float().contiguous()
        self.ptr, self.eps, self.unit = self.w.data_ptr(), float(norm.eps), bool(norm.unit_offset)

    def __call__(self, x: torch.Tensor, delta: torch.Tensor | None = None, out: torch.Tensor | None = None
                 ) -> torch.Tensor:
        """``x`` ``[rows, dim]`` contiguous (+= ``delta`` first, in place) -> its norm (into ``out``)."""
        if out is None:
            out = torch.empty(x.shape)
        _native().rw_add_rms_norm(x.data_ptr(), 0 if delta is None else delta.data_ptr(), self.ptr, x.shape[0],
                                  x.shape[1], self.eps, self.unit, out.data_ptr())
        return out


class _Layer:
    """One block's weights and constants, by address."""

    def __init__(self, block: nn.Module) -> None:
        attn, ffn = block.attn, block.ffn
        self.hq, self.hkv, self.d = attn.n_heads, attn.n_kv, attn.hd
        if self.d % 2:
            raise ValueError("RoPE needs an even head dim")
        self.qkv = ([_Linear(attn.wqkv, "qkv")] if attn.fused
                    else [_Linear(m, s) for m, s in ((attn.wq, "q"), (attn.wk, "k"), (attn.wv, "v"))])
        self.wo = _Linear(attn.wo, "o")
        self.q_norm = _Norm(attn.q_norm) if attn.q_norm is not None else None
        self.k_norm = _Norm(attn.k_norm) if attn.k_norm is not None else None
        self.attn = attn  # scale, window and soft-cap read on each pass: they are plain attributes
        self.attn_norm, self.ffn_norm = _Norm(block.attn_norm), _Norm(block.ffn_norm)
        self.post_attn = _Norm(block.post_attn_norm) if block.post_attn_norm is not None else None
        self.post_ffn = _Norm(block.post_ffn_norm) if block.post_ffn_norm is not None else None
        self.gate_up = ([_Linear(ffn.w_gate_up, "gate_up")] if ffn.fused
                        else [_Linear(ffn.w_gate, "gate"), _Linear(ffn.w_up, "up")])
        self.down = _Linear(ffn.w_down, "down")
        self.dim = self.wo.n
        self.keys = (("h", self.dim), ("qr", self.hq * self.d), ("att", self.hq * self.d),
                     ("act", self.down.k))
        self.act = rowwise.ACTS["gelu_tanh" if ffn.gelu else "silu"]
        self.rope_index = block.rope_index

    def _qkv(self, h: torch.Tensor, threads: int, work: _Work) -> list[tuple[torch.Tensor, int, int]]:
        """q, k, v as (tensor holding it, byte offset in a row, row stride in floats)."""
        hq, hkv, d = self.hq, self.hkv, self.d
        if len(self.qkv) == 1:
            y = self.qkv[0](h, threads, work)
            w = y.shape[1]
            parts = [(y, 0, w), (y, hq * d * _F32, w), (y, (hq + hkv) * d * _F32, w)]
        else:
            parts = [(p(h, threads, work), 0, p.n) for p in self.qkv]
        if self.q_norm is not None and self.k_norm is not None:
            t = h.shape[0]
            for i, (norm, heads) in enumerate(((self.q_norm, hq), (self.k_norm, hkv))):
                y, off, stride = parts[i]
                own = y.view(-1)[off // _F32:].as_strided((t, heads * d), (stride, 1)).contiguous()
                parts[i] = (norm(own.view(t * heads, d)), 0, heads * d)
        return parts

    def forward(self, x: torch.Tensor, delta: torch.Tensor | None, rope: tuple[torch.Tensor, torch.Tensor],
                k_cache: torch.Tensor, v_cache: torch.Tensor, rows: tuple[torch.Tensor, ...],
                threads: int, work: _Work) -> torch.Tensor:
        """x += delta; the block's own output (the next delta, a buffer of ``work``'s)."""
        m = _native()
        t, hq, hkv, d = x.shape[0], self.hq, self.hkv, self.d
        h_key, qr_key, att_key, act_key = self.keys
        h = self.attn_norm(x, delta, work.get(h_key))
        (q, qo, qs), (k, ko, ks), (v, vo, vs) = self._qkv(h, threads, work)
        table, row_seq, row_pos, slots = rows
        qr = work.get(qr_key)
        m.rw_rope_append(q.data_ptr() + qo, qs, k.data_ptr() + ko, ks, v.data_ptr() + vo, vs, t, hq, hkv, d,
                         rope[0].data_ptr(), rope[1].data_ptr(), slots.data_ptr(), qr.data_ptr(),
                         k_cache.data_ptr(), v_cache.data_ptr())
        att = work.get(att_key)
        attn = self.attn
        m.rw_attention(qr.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), k_cache.shape[1], hq, hkv, d,
                       table.data_ptr(), table.shape[1], row_seq.data_ptr(), row_pos.data_ptr(), t, float(attn.scale),
                       int(attn.window or 0), float(attn.softcap or 0.0), att.data_ptr(), threads)
        a = self.wo(att, threads, work)
        if self.post_attn is not None:
            a = self.post_attn(a)
        h = self.ffn_norm(x, a, h)  # q|k|v were read from h already
        if len(self.gate_up) == 1:
            gu = self.gate_up[0](h, threads, work)
            f = gu.shape[1] // 2
            gate, gate_ptr, up_ptr, stride = gu, gu.data_ptr(), gu.data_ptr() + f * _F32, 2 * f
        else:
            gate, up = (p(h, threads, work) for p in self.gate_up)
            f = gate.shape[1]
            gate_ptr, up_ptr, stride = gate.data_ptr(), up.data_ptr(), f
        act = work.get(act_key)
        m.rw_gated_act(gate_ptr, stride, up_ptr, stride, t, f, self.act, act.data_ptr())
        out = self.down(act, threads, work)
        return out if self.post_ffn is None else self.post_ffn(out)


class Plan:
    """A model's blocks by address (see the module docstring)."""

    def __init__(self, model: nn.Module) -> None:
        self.layers = [_Layer(b) for b in model.layers]
        self.norm = _Norm(model.norm)
        # Where each tensor the plan reads is held, the tensor and its address then: a replaced
        # module, parameter or storage (``param.data = ...``) shows as another object or a
        # changed address. Read from the modules' own dicts (nn.Module.__getattr__ would cost
        # more than the check), as columns that map() walks without a Python frame per entry.
        held = [(d, name, d[name]) for mod in model.layers.modules() for d in (mod._parameters, mod._buffers)
                for name in d if d[name] is not None]
        held.append((model.norm._parameters, "weight", model.norm.weight))
        children = [(mod._modules, name, child) for mod in (model, *model.layers.modules())
                    for name, child in mod._modules.items()]
        self.dicts, self.names, self.held = _columns([*held, *children])
        self.tensors = tuple(t for _, _, t in held)
        self.ptrs = tuple(t.data_ptr() for t in self.tensors)

    def current(self) -> bool:
        return (all(map(operator.is_, map(dict.get, self.dicts, self.names), self.held))
                and tuple(map(torch.Tensor.data_ptr, self.tensors)) == self.ptrs)


def _columns(rows: list[tuple[dict[str, Any], str, object]]) -> tuple[tuple[Any, ...], ...]:
    return tuple(zip(*rows, strict=True)) if rows else ((), (), ())


def plan(model: nn.Module) -> Plan:
    """The model's plan, rebuilt when a tensor it reads has moved or a module was replaced."""
    have: Plan | None = model.__dict__.get("_cpu_plan")
    if have is None or not have.current():
        have = Plan(model)
        object.__setattr__(model, "_cpu_plan", have)  # not a submodule: no state_dict entry
    return have


def forward(model: nn.Module, x: torch.Tensor, cache: PagedKVCache, lay: BatchLayout,
            n_layers: int | None = None) -> torch.Tensor:
    """``Transformer.forward`` from the embedded ``x`` ``[T, dim]`` (written to: the residual stream)."""
    p = plan(model)
    threads = torch.get_num_threads()
    positions = lay.positions.to(torch.int64).contiguous()
    slots = lay.slots.to(torch.int64).contiguous()
    ropes = [rowwise.rope_table(positions, model.inv_freq)]
    if model.inv_freq_local is not None:
        ropes.append(rowwise.rope_table(positions, model.inv_freq_local))
    row_seq = torch.repeat_interleave(torch.arange(len(lay.q_lens), dtype=torch.int32),
                                      torch.tensor(lay.q_lens, dtype=torch.int64))
    table = lay.table.to(torch.int32).contiguous()
    if x.shape[0] and (int(slots.min()) < 0 or int(slots.max()) >= cache.k[0].shape[0] * cache.k[0].shape[1]
                       or int(positions.max()) >= table.shape[1] * cache.k[0].shape[1]):
        raise ValueError("a row's slot or position lies outside the cache")
    rows = (table, row_seq, positions, slots)
    x = x.contiguous()
    delta: torch.Tensor | None = None
    work = _Work(x.shape[0])
    for i, layer in enumerate(p.layers[: n_layers or len(p.layers)]):
        delta = layer.forward(x, delta, ropes[layer.rope_index], cache.k[i], cache.v[i], rows, threads, work)
    return p.norm(x, delta)  # a tensor of its own: the caller keeps it
