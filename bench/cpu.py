"""The embedded default's target on the CPU, side by side with llama.cpp and Hugging Face
transformers on the same GGUF, at 1 and 2 threads (docs/kernels.md, docs/measurements.md).

Everything is measured in one run, interleaved (each repeat runs every contender once, in turn),
and reported as the range over repeats, since a shared machine's speed moves from one minute to
the next:

- decode: greedy tokens/s of ``--tokens`` new tokens after ``--prompt`` (raw, no chat template):
  ours through the engine's decoding loop (target-only, the verifier self-decodes), for each
  ``--weights`` form; llama.cpp (llama-cpp-python, optional) on the same file; transformers
  (optional) on the dequantized float weights.
  Beside it, each one's steady-state CPU time per token: all its threads, and each thread
  (main, Python's own, native ones such as OpenMP workers), start-up excluded.
- pass cost: a verification pass over M + 1 = 5 positions against a one-token pass (ours, and
  llama.cpp's one ``llama_decode`` of the same positions with every logit out).
- prefill: ``--prefill`` prompt tokens in one pass (ours, llama.cpp).
- agreement: ours and llama.cpp's greedy tokens on ``--agree-prompts`` built-in prompts x
  ``--agree-tokens`` tokens (raw, or ``--agree-chat`` in the chat template), counted up to each
  prompt's first difference; and llama.cpp with an f32 KV cache against its own defaults, which
  says how many of those tokens are near-ties that any difference in rounding flips.
- speculation: each of ``--drafters`` against target-only decoding on the demo's prompts, as
  ``sdcp_fast/benchlib/speedup.py`` measures it (interleaved pairs of the same tokens, same weights,
  same loop), over the prompts and for each prompt (each runs alone, one session).

    python bench/cpu.py                         # everything (minutes)
    python bench/cpu.py --quick                 # fewer repeats and prompts
    python bench/cpu.py --skip-hf --skip-spec   # decode, pass cost, prefill, agreement only
    python bench/cpu.py --agree-only --weights q4   # the agreement only (20 prompts x 32 tokens)
    python bench/cpu.py --kernels               # one product per kernel: ours vs torch f32 and int8

llama.cpp and transformers are optional peers: when one is missing, the table says why it was
skipped. llama.cpp comes through either binding of its C API: llama-cpp-python (built from its
sdist) or llama-cpp-py-sync (a prebuilt CPU library); the report names the binding and what
the library was built with (its SIMD flags).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import threading
import time
from functools import partial
from pathlib import Path
from typing import Any

import sdcp_fast  # noqa: F401  first: its OpenMP wait (sdcp_fast.native.wait_passively) precedes torch's libgomp

# isort: split
import torch

from sdcp_fast.benchlib.speedup import Timed, combined, interleaved, speedups

PROMPT = "The history of the Roman Empire"


def _range(xs: list[float]) -> str:
    if not xs:
        return "-"
    lo, hi, med = min(xs), max(xs), statistics.median(xs)
    return f"{med:.1f} ({lo:.1f}-{hi:.1f})"


def thread_ticks() -> dict[int, tuple[str, int]]:
    """This process's threads: CPU clock ticks (user + system) of each, by thread id, with a
    name: ``main``, a Python thread's own, else the kernel's (an OpenMP worker of ours or of
    llama.cpp's library)."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    names[os.getpid()] = "main"
    out = {}
    root = f"/proc/{os.getpid()}/task"
    for tid in os.listdir(root):
        try:
            with open(f"{root}/{tid}/stat") as f:
                stat = f.read()
        except OSError:  # it ended meanwhile
            continue
        comm, fields = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:].split()
        out[int(tid)] = (names.get(int(tid), f"{comm} (native)"), int(fields[11]) + int(fields[12]))
    return out


def per_thread_ms(before: dict[int, tuple[str, int]], after: dict[int, tuple[str, int]],
                  tokens: int) -> dict[str, float]:
    """CPU ms per token of each kind of thread between two :func:`thread_ticks` (threads of one
    name summed; the executors' numbered workers as one)."""
    tick_ms = 1e3 / os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    for tid, (name, ticks) in after.items():
        used = ticks - before.get(tid, (name, 0))[1]
        if used > 0 or name == "main":  # the main thread even below a tick: a decode ran there
            key = name.rstrip("0123456789").rstrip("_") or name
            out[key] = out.get(key, 0.0) + used * tick_ms / max(tokens, 1)
    return out


class Ours:
    """Our target in one ``--weights`` form, decoding through the engine's one loop."""

    def __init__(self, model: str, form: str) -> None:
        from sdcp_fast.model import quant_weights
        from sdcp_fast.model.contract_digests import scorer_digest
        from sdcp_fast.model.target_scorer import ModelRunner

        self.lm = quant_weights.load(model, form)
        self.form = self.lm.meta["weights"]
        self.runner = ModelRunner(self.lm.model, num_blocks=1024)
        self.digest = scorer_digest(self.runner)  # once: each decode would hash every weight again
        self.steady_ms: float | None = None  # of the last greedy decode
        self.threads_ms: dict[str, float] = {}  # likewise, by thread

    def encode(self, text: str) -> list[int]:
        from sdcp_fast.model.tokenizer import encode

        assert self.lm.tokenizer is not None
        return encode(self.lm.tokenizer, text)

    def greedy(self, prompt: list[int], n: int, drafter: Any = None) -> tuple[list[int], float]:
        """``n`` tokens; :attr:`steady_ms` from the process's CPU time at each committed round,
        :attr:`threads_ms` from each thread's at the first round and the one that completes ``n``."""
        from sdcp_fast.deploy.local import generate

        marks: list[tuple[float, int]] = []
        ticks: list[dict[int, tuple[str, int]]] = []

        def mark(info: Any) -> None:
            marks.append((time.process_time(), len(info.emitted)))
            if len(marks) == 1 or sum(k for _, k in marks) >= n:
                ticks.append(thread_ticks())

        res = generate(self.runner, drafter, [prompt], n, on_round=mark, target_digest=self.digest)[0]
        tokens = sum(k for _, k in marks[1:])
        self.steady_ms = (marks[-1][0] - marks[0][0]) / tokens * 1e3 if tokens else None
        self.threads_ms = per_thread_ms(ticks[0], ticks[-1], tokens) if len(ticks) > 1 else {}
        return list(res.tokens), len(res.tokens) / max(res.seconds, 1e-9)

    def timed(self, prompt: list[int], n: int, drafter: Any = None) -> Timed:
        """One session of ``n`` tokens, as a side of a speedup pair."""
        from sdcp_fast.deploy.local import generate

        res = generate(self.runner, drafter, [prompt], n, target_digest=self.digest)[0]
        return Timed(len(res.tokens), res.seconds, res.rounds, res.proposed, res.accepted, res.rounds)

    def pass_ratio(self, prompt: list[int], m: int = 4, reps: int = 8) -> float:
        """Median time of a pass over m + 1 new positions / of a one-position pass."""
        from sdcp_fast.model.interfaces import ScoreRequest

        r = self.runner
        r.release(b"p")
        r.prefill(b"p", prompt)
        one, many = [], []
        for _ in range(reps):
            t = time.perf_counter()
            r.decode_one([(b"p", prompt)])
            one.append(time.perf_counter() - t)
            t = time.perf_counter()
            r.score([ScoreRequest(b"p", prompt, [11] * m)])
            many.append(time.perf_counter() - t)
        r.release(b"p")
        return statistics.median(many) / statistics.median(one)

    def prefill_s(self, tokens: list[int]) -> float:
        self.runner.release(b"f")
        t = time.perf_counter()
        self.runner.prefill(b"f", tokens)
        dt = time.perf_counter() - t
        self.runner.release(b"f")
        return dt


class _Binding:
    """The C API of whichever llama.cpp binding is installed, used the same way through both:
    llama-cpp-python (ctypes; a wheel or a build from its sdist) or llama-cpp-py-sync (cffi,
    prebuilt CPU library). Both load llama.cpp's own shared library; only the glue differs."""

    def __init__(self) -> None:
        if importlib.util.find_spec("llama_cpp") is not None:
            import ctypes

            import llama_cpp

            self.lib, self.string = llama_cpp, bytes
            self.name = f"llama-cpp-python {llama_cpp.__version__}"
            self.array = lambda toks: (llama_cpp.llama_token * len(toks))(*toks)
            self._quiet = llama_cpp.llama_log_callback(lambda level, text, data: None)
            llama_cpp.llama_log_set(self._quiet, ctypes.c_void_p(0))
        else:
            import llama_cpp_py_sync
            from llama_cpp_py_sync._cffi_bindings import get_ffi, get_lib

            ffi = get_ffi()
            self.lib, self.string = get_lib(), ffi.string
            self.name = (f"llama-cpp-py-sync {llama_cpp_py_sync.__version__} "
                         f"(llama.cpp {llama_cpp_py_sync.__llama_cpp_commit__[:10]})")
            self.array = lambda toks: ffi.new("llama_token[]", toks)
            self._quiet = ffi.callback("void(enum ggml_log_level, const char *, void *)", lambda *a: None)
            self.lib.llama_log_set(self._quiet, ffi.NULL)
        self.lib.llama_backend_init()
        self.system_info = self.string(self.lib.llama_print_system_info()).decode().strip()


class LlamaCpp:
    """llama.cpp on the same GGUF, greedy, one ``llama_decode`` per generated token (as its
    own generation loop does), its default context settings (an f16 KV cache, flash attention
    where it chooses it), ``threads`` for decode and batch; ``exact``: an f32 KV cache and no
    flash attention instead (``-ctk f32 -ctv f32 -fa off``)."""

    def __init__(self, path: Path, threads: int, *, exact: bool = False) -> None:
        self.c = c = _Binding()
        lib = c.lib
        mp = lib.llama_model_default_params()
        mp.n_gpu_layers = 0
        self.model = lib.llama_model_load_from_file(str(path).encode(), mp)
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load {path}")
        cp = lib.llama_context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_ubatch = 2048, 512, 512
        cp.n_threads = cp.n_threads_batch = threads
        if exact:
            cp.type_k = cp.type_v = 0  # GGML_TYPE_F32
            cp.flash_attn_type = 0
        self.ctx = lib.llama_init_from_model(self.model, cp)
        self.sampler = lib.llama_sampler_init_greedy()
        self.memory = lib.llama_get_memory(self.ctx)
        self._batch: Any = None
        self._held = 0
        self.steady_ms: float | None = None  # of the last greedy decode
        self.threads_ms: dict[str, float] = {}  # likewise, by thread

    def _decode(self, tokens: list[int]) -> None:
        lib = self.c.lib
        for i in range(0, len(tokens), 512):
            chunk = self.c.array(tokens[i:i + 512])
            if lib.llama_decode(self.ctx, lib.llama_batch_get_one(chunk, len(tokens[i:i + 512]))) != 0:
                raise RuntimeError("llama_decode failed")

    def greedy(self, prompt: list[int], n: int) -> tuple[list[int], float]:
        """``n`` greedy tokens after ``prompt``; tokens/s from the call to the last token, the
        prompt's pass included (as ours and HF's are timed)."""
        lib = self.c.lib
        t = time.perf_counter()
        lib.llama_memory_clear(self.memory, True)
        self._decode(prompt)
        out: list[int] = []
        first, ticks = 0.0, {}
        for k in range(n):
            tok = int(lib.llama_sampler_sample(self.sampler, self.ctx, -1))
            out.append(tok)
            if k == 0:
                first, ticks = time.process_time(), thread_ticks()
            if k + 1 < n:
                self._decode([tok])
        self.steady_ms = (time.process_time() - first) / (n - 1) * 1e3 if n > 1 else None
        self.threads_ms = per_thread_ms(ticks, thread_ticks(), n - 1) if n > 1 else {}
        return out, n / (time.perf_counter() - t)

    def prefill_s(self, tokens: list[int]) -> float:
        self.c.lib.llama_memory_clear(self.memory, True)
        t = time.perf_counter()
        self._decode(tokens)
        return time.perf_counter() - t

    def prime(self, tokens: list[int]) -> None:
        """Hold exactly ``tokens`` in the KV cache (the context of :meth:`pass_s`)."""
        self.c.lib.llama_memory_clear(self.memory, True)
        self._decode(tokens)
        self._held = len(tokens)

    def pass_ratio(self, prompt: list[int], m: int = 4, reps: int = 8) -> float:
        """Median time of a pass over m + 1 new positions / of a one-position pass, as
        :meth:`Ours.pass_ratio` measures ours (wall time, the prompt's last token first)."""
        self.prime(prompt[:-1])
        one = [self.pass_s(prompt[-1:], time.perf_counter) for _ in range(reps)]
        many = [self.pass_s([prompt[-1], *[11] * m], time.perf_counter) for _ in range(reps)]
        return statistics.median(many) / statistics.median(one)

    def pass_s(self, tokens: list[int], clock: Any = time.thread_time) -> float:
        """Thread CPU seconds (or ``clock``'s) of one ``llama_decode`` of ``tokens`` after the
        primed context, with every position's logits out (a verification pass needs them all,
        and the head is a fifth of the model); the positions are removed from the KV cache
        again afterwards. At one thread ggml computes on the calling thread, so its thread CPU
        time is the pass's (it equals the process's to microseconds)."""
        lib, n, p0 = self.c.lib, len(tokens), self._held
        if self._batch is None:
            self._batch = lib.llama_batch_init(64, 0, 1)
        b = self._batch
        b.n_tokens = n
        for i, tok in enumerate(tokens):
            b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = tok, p0 + i, 1, 1
            b.seq_id[i][0] = 0
        t = clock()
        failed = lib.llama_decode(self.ctx, b)
        dt = clock() - t
        lib.llama_memory_seq_rm(self.memory, 0, p0, -1)
        if failed:
            raise RuntimeError("llama_decode failed")
        return dt

    def close(self) -> None:
        lib = self.c.lib
        if self._batch is not None:
            lib.llama_batch_free(self._batch)
        lib.llama_sampler_free(self.sampler)
        lib.llama_free(self.ctx)
        lib.llama_model_free(self.model)


def _llama_unavailable(path: Path) -> str | None:
    if importlib.util.find_spec("llama_cpp") is None and importlib.util.find_spec("llama_cpp_py_sync") is None:
        return "no llama.cpp binding is installed (pip install llama-cpp-python, or llama-cpp-py-sync)"
    if path.suffix != ".gguf":
        return f"{path} is not a GGUF file"
    try:
        _Binding()
    except (OSError, RuntimeError) as exc:  # a prebuilt library this system cannot load
        return f"the llama.cpp library does not load here: {str(exc).splitlines()[0][:200]}"
    return None


def _cores() -> tuple[int, int, int] | None:
    """Jiffies of all CPUs since boot from /proc/stat: busy (steal included), stolen by the
    hypervisor, all; None where there is no /proc/stat."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    return sum(v) - v[3] - v[4], v[7], sum(v)


def _timed(dec: dict[str, list[float]], cpu: dict[str, list[float]], prof: dict[str, dict[str, list[float]]],
           name: str, who: Any, run: Any) -> None:
    """One decode (``run()``, by ``who``): its tokens/s into ``dec``, its steady-state CPU ms
    per token into ``cpu``: the whole process's CPU time from its first token to its last, per
    token (``who.steady_ms``), so that what a call costs once (for ours the in-process
    deployment's start and stop, the contract's digests, the prompt's pass) is left out; for a
    contender without that mark (HF), the whole call's. CPU time, since a shared machine's
    load stretches every contender's wall time; at one thread it hardly moves their CPU time.

    ``prof`` gets what the machine did meanwhile: ``others``, the share of all cores' time that
    other processes held (busy time, steal included, less this process's CPU time), and
    ``preempted``, this process's involuntary context switches per token (all its threads).
    With two threads on two cores every parallel region waits for both threads, so a core held
    by another process stalls the region until the scheduler gives it back."""
    import resource

    before, nivcsw = _cores(), resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw
    c = time.process_time()
    tokens, rate = run()
    used = time.process_time() - c
    n = max(len(tokens), 1)
    steady = getattr(who, "steady_ms", None)
    cpu.setdefault(name, []).append(used / n * 1e3 if steady is None else steady)
    dec.setdefault(name, []).append(rate)
    after = _cores()
    prof.setdefault("preempted", {}).setdefault(name, []).append(
        (resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw - nivcsw) / n)
    if getattr(who, "threads_ms", None):
        prof.setdefault("threads", {}).setdefault(name, []).append(dict(who.threads_ms))
    if before is not None and after is not None and after[2] > before[2]:
        ours = used * os.sysconf("SC_CLK_TCK")
        prof.setdefault("others", {}).setdefault(name, []).append(
            100 * max(after[0] - before[0] - ours, 0) / (after[2] - before[2]))


def _hf_unavailable() -> str | None:
    if importlib.util.find_spec("transformers") is None:
        return "transformers is not installed (pip install 'sdcp-fast[compare]')"
    return None


class HF:
    """transformers' greedy generate on our dequantized float32 weights."""

    def __init__(self, ours: Ours, tmp: Path) -> None:
        import transformers

        from sdcp_fast.model import quant_weights
        from sdcp_fast.model.loader import save_hf_dir

        f32 = ours if ours.form == "f32" else None
        lm = f32.lm if f32 is not None else quant_weights.load(ours.lm.source, "f32")
        save_hf_dir(lm.model, tmp, lm.tokenizer, dtype=torch.float32)
        self.model = transformers.AutoModelForCausalLM.from_pretrained(str(tmp)).eval()

    @torch.inference_mode()
    def greedy(self, prompt: list[int], n: int) -> tuple[list[int], float]:
        ids = torch.tensor([prompt])
        t = time.perf_counter()
        out = self.model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False)
        dt = time.perf_counter() - t
        return out[0, len(prompt):].tolist(), n / dt


def prefixes(a: list[list[int]], b: list[list[int]]) -> list[tuple[int, int]]:
    """For each pair: the tokens up to its first difference, and the tokens compared."""
    out = []
    for x, y in zip(a, b, strict=True):
        n = min(len(x), len(y))
        k = 0
        while k < n and x[k] == y[k]:
            k += 1
        out.append((k, n))
    return out


def agreement(a: list[list[int]], b: list[list[int]]) -> tuple[int, int]:
    """Tokens up to each pair's first difference, summed; and the total compared."""
    got = prefixes(a, b)
    return sum(k for k, _ in got), sum(n for _, n in got)


def agree(ours: dict[str, Ours], llama: LlamaCpp, texts: list[str], n: int, *,
          exact: LlamaCpp | None = None) -> dict[str, Any]:
    """Each form's greedy tokens against llama.cpp's, ``n`` per prompt, the same token ids in.
    With ``exact`` (llama.cpp with an f32 KV cache, as ours keeps), each form against that one
    too, and that one against llama.cpp's defaults: how far llama.cpp's own settings move its
    tokens (the near-ties any change of rounding flips)."""
    first = next(iter(ours.values()))
    prompts = [first.encode(t) for t in texts]
    theirs = [llama.greedy(p, n)[0] for p in prompts]
    exact_out = None if exact is None else [exact.greedy(p, n)[0] for p in prompts]

    def figures(a: list[list[int]], b: list[list[int]]) -> dict[str, Any]:
        got = prefixes(a, b)
        return {"same": sum(k for k, _ in got), "total": sum(m for _, m in got), "prompts": len(prompts),
                "identical": sum(k == m for k, m in got), "prefix": [k for k, _ in got]}

    out = {}
    for form, o in ours.items():
        mine = [o.greedy(p, n)[0] for p in prompts]
        out[f"ours {form}"] = figures(mine, theirs)
        if exact_out is not None:
            out[f"ours {form} vs llama.cpp with an f32 KV cache"] = figures(mine, exact_out)
    if exact_out is not None:
        out["llama.cpp with an f32 KV cache, no flash attention"] = figures(exact_out, theirs)
    return out


def kernel_table(threads: int = 1) -> str:
    """Microseconds per product (thread CPU time, median of 5 x 200 calls; 5 x 10 for the head)
    at SmolLM2-135M's shapes: torch f32, torch's dynamic int8 linear on each quantized engine,
    and ours on each block format."""
    from sdcp_fast.kernels import quant

    torch.set_num_threads(threads)

    def tm(f: Any, n: int) -> float:
        f()
        got = []
        for _ in range(5):
            c = time.thread_time()
            for _ in range(n):
                f()
            got.append((time.thread_time() - c) / n * 1e6)
        return statistics.median(got)

    engines = [e for e in ("fbgemm", "onednn") if e in torch.backends.quantized.supported_engines]
    head = ["shape (N x K), rows", "f32", *(f"torch int8 {e}" for e in engines), "ours q8_0", "ours q4_1",
            "ours q4_0"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for n_out, k in ((1536, 576), (576, 1536), (49152, 576)):
        w = torch.randn(n_out, k)
        reps = 200 if n_out < 10000 else 10
        for rows in (1, 5):
            x = torch.randn(rows, k)
            cells = [tm(partial(torch.nn.functional.linear, x, w), reps)]
            for e in engines:
                torch.backends.quantized.engine = e
                lin = torch.ao.nn.quantized.dynamic.Linear(k, n_out, dtype=torch.qint8)
                lin.set_weight_bias(torch.quantize_per_tensor(w, float(w.abs().max()) / 127, 0, torch.qint8), None)
                cells.append(tm(partial(lin, x), reps))
            for kind in ("q8_0", "q4_1", "q4_0"):
                f = quant.launcher(quant.quantize(w, kind))
                cells.append(tm(partial(f, x), reps))
            lines.append(f"| {n_out} x {k}, {rows} | " + " | ".join(f"{c:.0f}" for c in cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2")
    p.add_argument("--weights", default="q4,q8_0,f32", help="our forms, comma-separated")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--prompt", default=PROMPT)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--prefill", type=int, default=512)
    p.add_argument("--agree-prompts", type=int, default=20)
    p.add_argument("--agree-tokens", type=int, default=32)
    p.add_argument("--agree-chat", action="store_true",
                   help="agreement prompts in the model's chat template (as the demo and the front end send them)")
    p.add_argument("--drafters", default="ngram,layerskip:8,model:smollm2-draft")
    p.add_argument("--spec-prompts", type=int, default=6)
    p.add_argument("--skip-hf", action="store_true")
    p.add_argument("--skip-spec", action="store_true")
    p.add_argument("--agree-only", action="store_true",
                   help="only the agreement with llama.cpp (--agree-prompts x --agree-tokens, first thread count)")
    p.add_argument("--quick", action="store_true", help="2 repeats, 6 agreement prompts, 3 speculation prompts")
    p.add_argument("--out", default=None, help="write the figures as JSON here too")
    p.add_argument("--kernels", action="store_true", help="only the per-product table (1 thread)")
    args = p.parse_args(argv)
    if args.kernels:
        print(kernel_table())
        return 0
    if args.quick:
        args.repeats, args.agree_prompts, args.spec_prompts = 2, 6, 3

    from sdcp_fast.data import prompts as builtin
    from sdcp_fast.deploy.catalog import load_drafter, target_of
    from sdcp_fast.model import loader
    from sdcp_fast.model.build import chat_template

    path = loader.resolve(args.model)
    forms = [f.strip() for f in args.weights.split(",") if f.strip()]
    threads = [int(t) for t in args.threads.split(",")]
    ours = {f: Ours(args.model, f) for f in forms}
    first = next(iter(ours.values()))
    prompt = first.encode(args.prompt)
    notes: list[str] = []
    why_llama = _llama_unavailable(path)
    why_hf = "--skip-hf" if args.skip_hf else _hf_unavailable()
    if why_llama:
        notes.append(f"llama.cpp skipped: {why_llama}")
    if why_hf and not args.agree_only:
        notes.append(f"HF transformers skipped: {why_hf}")
    hf = None
    if why_hf is None and not args.agree_only:
        import tempfile

        hf = HF(ours.get("f32", first), Path(tempfile.mkdtemp(prefix="sdcp-bench-hf-")))

    results: dict[str, Any] = {"command": " ".join(["python bench/cpu.py", *(argv or sys.argv[1:])]),
                               "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                               "load_average": os.getloadavg(), "notes": notes, "decode": {}, "decode_cpu_ms": {},
                               "decode_others_pct": {}, "decode_preempted": {}, "decode_threads_ms": {},
                               "pass_ratio": {},
                               "prefill_s": {}, "agreement": {}, "speculation": {},
                               "speculation_by_prompt": {}, "spec_prompts": []}
    if not why_llama:
        binding = _Binding()
        results["llama_cpp"] = {"binding": binding.name, "system_info": binding.system_info}
    evals, train = builtin("eval"), builtin("train")
    long_prompt = first.encode(" ".join(p["text"] for p in evals + train))
    long_prompt = (long_prompt * (args.prefill // max(len(long_prompt), 1) + 1))[: args.prefill]
    # Agreement: raw text, the eval prompts then distillation seeds; speculation: the demo's mix
    # (a copy prompt first, then the chat ones, in the chat template).
    agree_texts = [p["text"] for p in evals + train][: args.agree_prompts]
    chat = chat_template(first.lm)
    if args.agree_chat and chat is not None:
        agree_texts = [chat(t) for t in agree_texts]
    demo_texts = [p["text"] for p in evals if p["kind"] == "copy"][:1] + [p["text"] for p in evals
                                                                          if p["kind"] == "chat"]
    spec_texts = [t if chat is None else chat(t) for t in demo_texts][: args.spec_prompts]
    results["spec_prompts"] = demo_texts[: args.spec_prompts]
    if args.agree_only:
        threads = threads[:1] if why_llama is None else []
    for th in threads:
        torch.set_num_threads(th)
        llama = None if why_llama else LlamaCpp(path, th)
        if llama is not None and th == threads[0] and agree_texts:
            print(f"bench/cpu.py: {th} thread(s): agreement with llama.cpp", file=sys.stderr, flush=True)
            exact = LlamaCpp(path, th, exact=True)
            results["agreement"] = agree(ours, llama, agree_texts, args.agree_tokens, exact=exact)
            exact.close()
        if args.agree_only:
            llama.close()
            break
        print(f"bench/cpu.py: {th} thread(s): decode, pass cost, prefill", file=sys.stderr, flush=True)
        dec: dict[str, list[float]] = {}
        cpu: dict[str, list[float]] = {}
        prof: dict[str, dict[str, list[float]]] = {}
        timed = partial(_timed, dec, cpu, prof)
        pre: dict[str, list[float]] = {}
        ratio: dict[str, list[float]] = {}
        for _ in range(args.repeats):
            for form, o in ours.items():
                timed(f"ours {form}", o, partial(o.greedy, prompt, args.tokens))
                ratio.setdefault(f"ours {form}", []).append(o.pass_ratio(prompt))
                pre.setdefault(f"ours {form}", []).append(o.prefill_s(long_prompt))
            if llama is not None:
                timed("llama.cpp", llama, partial(llama.greedy, prompt, args.tokens))
                ratio.setdefault("llama.cpp", []).append(llama.pass_ratio(prompt))
                pre.setdefault("llama.cpp", []).append(llama.prefill_s(long_prompt))
            if hf is not None:
                timed("HF transformers (f32)", hf, partial(hf.greedy, prompt, args.tokens))
        results["decode"][th] = dec
        results["decode_cpu_ms"][th] = cpu
        results["decode_others_pct"][th] = prof.get("others", {})
        results["decode_preempted"][th] = prof.get("preempted", {})
        results["decode_threads_ms"][th] = prof.get("threads", {})
        results["pass_ratio"][th] = ratio
        results["prefill_s"][th] = pre
        if llama is not None:
            llama.close()
        # A slow level (two threads on a loaded machine) must not take the finished ones with it.
        print("\n".join(_timing_lines(results, [th])), file=sys.stderr, flush=True)
        if args.out:
            Path(args.out).write_text(json.dumps(results, indent=1, default=str) + "\n")
    if not args.skip_spec and not args.agree_only:
        print("bench/cpu.py: speculation", file=sys.stderr, flush=True)
        torch.set_num_threads(threads[0])
        texts = spec_texts
        for form, o in ours.items():
            spec: dict[str, list[float]] = {}
            each: dict[str, list[list[float]]] = {}
            target = target_of(args.model, o.lm)
            drafters = {d: load_drafter(d, target)[0] for d in args.drafters.split(",") if d}
            prompts = [o.encode(t) for t in texts]

            def side(o: Ours, prompts: list[list[int]], drafter: Any) -> Any:
                return lambda _: [o.timed(p, args.tokens, drafter) for p in prompts]

            for name, d in drafters.items():
                pairs = interleaved(side(o, prompts, d), side(o, prompts, None), max(1, args.repeats - 1))
                spec[name] = speedups([(combined(s), combined(b)) for s, b in pairs])
                each[name] = [speedups([(s[i], b[i]) for s, b in pairs]) for i in range(len(prompts))]
            results["speculation"][form] = spec
            results["speculation_by_prompt"][form] = each
    results["load_average_end"] = os.getloadavg()
    print(report(results, threads))
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1, default=str) + "\n")
    return 0


def _timing_lines(r: dict[str, Any], threads: list[int]) -> list[str]:
    lines = ["decode tokens/s, median (range over repeats):"]
    names = sorted({n for th in threads for n in r["decode"][th]})
    lines.append(f"  {'':<24}" + "".join(f"{f'{th} thread' + ('s' if th > 1 else ''):>22}" for th in threads))
    for n in names:
        lines.append(f"  {n:<24}" + "".join(f"{_range(r['decode'][th].get(n, [])):>22}" for th in threads))
    if r.get("decode_cpu_ms"):
        lines.append("decode CPU ms per token in steady state (process CPU time, all threads, from the first "
                     "token to the last: start-up excluded; HF's whole call), median (range):")
        for n in names:
            lines.append(f"  {n:<24}" + "".join(f"{_range(r['decode_cpu_ms'][th].get(n, [])):>22}"
                                                 for th in threads))
    for key, what in (("decode_others_pct", "% of all cores' time held by other processes during each decode "
                                            "(busy time, steal included, less ours), median (range):"),
                      ("decode_preempted", "involuntary context switches per token (all our threads), "
                                           "median (range):")):
        if any(r.get(key, {}).get(th) for th in threads):
            lines.append(what)
            for n in names:
                lines.append(f"  {n:<24}" + "".join(f"{_range(r[key].get(th, {}).get(n, [])):>22}"
                                                     for th in threads))
    if any(r.get("decode_threads_ms", {}).get(th) for th in threads):
        lines.append("the steady-state CPU ms per token by thread (/proc/<pid>/task/*/stat, 10 ms ticks), median over "
                     "repeats: main, Python's own threads, native threads (OpenMP workers):")
        for th in threads:
            for n, reps in sorted(r["decode_threads_ms"].get(th, {}).items()):
                kinds = sorted({k for rep in reps for k in rep}, key=lambda k: (k != "main", k))
                cells = ", ".join(f"{k} {statistics.median([rep.get(k, 0.0) for rep in reps]):.1f}" for k in kinds)
                lines.append(f"  {th} thread(s), {n}: {cells}")
    for th in threads:
        dec, cpu = r["decode"][th], r.get("decode_cpu_ms", {}).get(th, {})
        if "llama.cpp" in dec:
            lc = statistics.median(dec["llama.cpp"])
            ratios = ", ".join(f"{n} {statistics.median(v) / lc:.2f}x" for n, v in dec.items() if n.startswith("ours"))
            if cpu.get("llama.cpp"):
                lc_cpu = statistics.median(cpu["llama.cpp"])
                ratios += "; CPU per token " + ", ".join(f"{n} {statistics.median(v) / lc_cpu:.2f}x"
                                                         for n, v in cpu.items() if n.startswith("ours"))
            lines.append(f"  vs llama.cpp at {th} thread(s), tokens/s: {ratios}")
    lines.append("")
    lines.append("pass over 5 positions / 1-position pass (wall time, median of 8; llama.cpp on the same GGUF):")
    for th in threads:
        lines.append(f"  {th} thread(s): " + ", ".join(f"{n} {_range(v)}" for n, v in r["pass_ratio"][th].items()))
    lines.append("prefill seconds:")
    for th in threads:
        lines.append(f"  {th} thread(s): " + ", ".join(f"{n} {min(v):.3f}" for n, v in r["prefill_s"][th].items()))
    return lines


def report(r: dict[str, Any], threads: list[int]) -> str:
    end = r.get("load_average_end")
    lines = [f"# {r['command']}  ({r['date']}, load average {r['load_average'][0]:.1f} at the start"
             + ("" if end is None else f", {end[0]:.1f} at the end") + ")", ""]
    threads = [th for th in threads if th in r["decode"]]  # none with --agree-only
    if threads:
        lines.extend(_timing_lines(r, threads))
    if r["agreement"]:
        lines.append("greedy agreement with llama.cpp (its defaults unless named; tokens up to each prompt's "
                     "first difference):")
        for form, a in r["agreement"].items():
            lines.append(f"  {form}: {a['same']}/{a['total']} = {a['same'] / max(a['total'], 1):.1%} "
                         f"over {a['prompts']} prompts, {a['identical']} identical throughout; "
                         f"prefixes {a['prefix']}")
    if r["speculation"]:
        lines.append("speculation speedup (target-only time / speculative time of the same tokens, interleaved "
                     "pairs, same weights):")
        for form, s in r["speculation"].items():
            lines.append(f"  {form}: " + ", ".join(f"{d} {_range(v)}" for d, v in s.items()))
        lines.append("  each prompt alone (one session):")
        for form, by in r.get("speculation_by_prompt", {}).items():
            for i, text in enumerate(r.get("spec_prompts", [])):
                lines.append(f"    {form} {text[:40]!r}: " + ", ".join(f"{d} {_range(v[i])}" for d, v in by.items()))
    if "llama_cpp" in r:
        lines.append(f"llama.cpp through {r['llama_cpp']['binding']}: {r['llama_cpp']['system_info']}")
    lines.extend(f"note: {n}" for n in r["notes"])
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
