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
A small pass (decoding, verification) replays the native calls of its shape's first pass, their
arguments kept, over buffers its program keeps (see ``CAPTURE_ROWS``).
Used for float32 host passes without autograd on the gather path (``lay.attention`` None);
anything else (CUDA, bfloat16, training, the paged kernels) runs the torch modules.
"""

from __future__ import annotations

import operator
import threading
from collections.abc import Callable
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
    calls = getattr(_recording, "calls", None)
    return native.module() if calls is None else _Recorder(native.module(), calls)


_recording = threading.local()  # this thread's pass being captured: its calls


class _Recorder:
    """The native module, each call also kept with its arguments (a pass being captured)."""

    def __init__(self, mod: Any, calls: list[tuple[Callable[..., Any], tuple[Any, ...]]]) -> None:
        self.mod, self.calls = mod, calls

    def __getattr__(self, name: str) -> Callable[..., Any]:
        fn = getattr(self.mod, name)

        def call(*args: Any) -> Any:
            self.calls.append((fn, args))
            return fn(*args)

        return call


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
        # A pass runs from a captured program only where a layer's every step is a native call
        # on buffers of its own (no bias added by torch, no q/k or post norms' copies).
        self.capturable = all(
            lay.q_norm is None and lay.k_norm is None and lay.post_attn is None and lay.post_ffn is None
            and all(lin.bias is None or not lin.quant for lin in (*lay.qkv, lay.wo, *lay.gate_up, lay.down))
            for lay in self.layers)
        self.programs: dict[tuple[int, ...], _Program] = {}

    def current(self) -> bool:
        return (all(map(operator.is_, map(dict.get, self.dicts, self.names), self.held))
                and tuple(map(torch.Tensor.data_ptr, self.tensors)) == self.ptrs)


def _columns(rows: list[tuple[dict[str, Any], str, object]]) -> tuple[tuple[Any, ...], ...]:
    return tuple(zip(*rows, strict=True)) if rows else ((), (), ())


# Passes of at most this many rows (decoding and verification rounds) run from a program: the
# native calls of their first pass of that shape, kept with their arguments, on buffers the
# program keeps (its inputs copied in). The layers' Python between the calls cost a sixth of a
# one-position pass of SmolLM2 q4.
CAPTURE_ROWS = 16
MAX_PROGRAMS = 64


class _Program:
    """A pass shape's native calls over buffers of its own (see CAPTURE_ROWS)."""

    def __init__(self, model: nn.Module, cache: PagedKVCache, t: int, b: int, width: int,
                 consts: tuple[Any, ...]) -> None:
        dim = model.norm.weight.shape[0]
        self.lock = threading.Lock()  # a model's runners may pass on two threads at once
        self.x = torch.empty(t, dim)
        self.positions = torch.empty(t, dtype=torch.int64)
        self.slots = torch.empty(t, dtype=torch.int64)
        self.row_seq = torch.empty(t, dtype=torch.int32)
        self.table = torch.zeros(b, width, dtype=torch.int32)
        half = model.inv_freq.shape[0]
        self.ropes = [(torch.empty(t, half), torch.empty(t, half))
                      for _ in range(1 if model.inv_freq_local is None else 2)]
        self.work = _Work(t)
        self.kv = _kv_ptrs(cache)
        self.consts = consts
        self.calls: list[tuple[Callable[..., Any], tuple[Any, ...]]] = []
        self.out: torch.Tensor | None = None

    def fits(self, cache: PagedKVCache, width: int, consts: tuple[Any, ...]) -> bool:
        return width <= self.table.shape[1] and consts == self.consts and _kv_ptrs(cache) == self.kv

    def load(self, x: torch.Tensor, rows: tuple[torch.Tensor, ...],
             ropes: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        table, row_seq, positions, slots = rows
        self.x.copy_(x)
        self.table[:, : table.shape[1]].copy_(table)  # columns past a row's blocks are never read
        self.row_seq.copy_(row_seq)
        self.positions.copy_(positions)
        self.slots.copy_(slots)
        for (cos, sin), (c, s) in zip(self.ropes, ropes, strict=True):
            cos.copy_(c)
            sin.copy_(s)


def _kv_ptrs(cache: PagedKVCache) -> tuple[Any, ...]:
    return (*cache.k[0].shape, *map(torch.Tensor.data_ptr, cache.k), *map(torch.Tensor.data_ptr, cache.v))


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
    layers = p.layers[: n_layers or len(p.layers)]
    t = x.shape[0]
    if p.capturable and 0 < t <= CAPTURE_ROWS:
        consts = tuple((layer.attn.scale, layer.attn.window, layer.attn.softcap) for layer in layers)
        key = (id(cache), t, len(lay.q_lens), threads, len(layers))
        prog = p.programs.get(key)
        if prog is None or not prog.fits(cache, table.shape[1], consts):
            if len(p.programs) >= MAX_PROGRAMS:
                p.programs.clear()
            width = max(table.shape[1], 2 * (prog.table.shape[1] if prog is not None else 0), 8)
            prog = p.programs[key] = _Program(model, cache, t, len(lay.q_lens), width, consts)
        if prog.lock.acquire(blocking=False):
            try:
                prog.load(x, rows, ropes)
                if prog.out is None:  # its first pass: computed while its calls are kept
                    _recording.calls = prog.calls
                    try:
                        prog.out = _layers(layers, prog.x, prog.ropes, cache,
                                           (prog.table, prog.row_seq, prog.positions, prog.slots), threads,
                                           prog.work)
                    except BaseException:
                        del p.programs[key]
                        raise
                    finally:
                        _recording.calls = None
                else:
                    for fn, args in prog.calls:
                        fn(*args)
                return p.norm(prog.x, prog.out)  # a tensor of its own: the caller keeps it
            finally:
                prog.lock.release()
    x = x.contiguous()
    return p.norm(x, _layers(layers, x, ropes, cache, rows, threads, _Work(t)))


def _layers(layers: list[_Layer], x: torch.Tensor, ropes: list[tuple[torch.Tensor, torch.Tensor]],
            cache: PagedKVCache, rows: tuple[torch.Tensor, ...], threads: int, work: _Work) -> torch.Tensor | None:
    """The layers over the residual stream ``x`` (written to); the last one's output."""
    delta: torch.Tensor | None = None
    for i, layer in enumerate(layers):
        delta = layer.forward(x, delta, ropes[layer.rope_index], cache.k[i], cache.v[i], rows, threads, work)
    return delta
