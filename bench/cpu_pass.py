"""Where a CPU pass's time goes: the row-invariant native pass (``model/cpu_pass.py``) against
the torch modules it replaces, and llama.cpp's own pass on the same GGUF, in one process,
interleaved; and what the pass ratios allow speculation.

For each ``--weights`` form: thread CPU time (robust to a shared machine's preemption) of a
one-position pass and of a verification pass over M + 1 positions (each M of ``--m``) after
``--context`` tokens, median and minimum over ``--reps`` rounds, each round running every path
in turn; and each path's (M + 1)-position / 1-position ratio. llama.cpp (an optional peer, as
in bench/cpu.py; the table says why it was skipped) runs with the first form's rounds, on the
same token ids: one ``llama_decode`` of the last context token alone, or of it and M more, with
every position's logits out (what a verification pass needs), then the M + 1 positions removed
from its KV cache again. 1 thread everywhere.

Then the speculation bound from those ratios: a round proposes M tokens, of which, at
per-token acceptance a, (1 - a^(M+1)) / (1 - a) are committed per pass, and costs a pass over
M + 1 positions (the ratio c(M)) plus M drafted tokens (``--draft-cost``, in one-position
passes each): the bound is their quotient, at each acceptance of ``--acceptance``, and for each
goal of ``--goals`` the acceptance it needs (none: not even with every token accepted).
Beside the passes, the time to read the model file's bytes from memory once: a pass bound by
its weights' bytes would cost about that, at any number of positions.

    python bench/cpu_pass.py                       # SmolLM2: q4 and f32, llama.cpp, M = 1..4
    python bench/cpu_pass.py --weights q4 --reps 20
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from sdcp_fast.benchlib.speedup import acceptance_needed, speedup_bound

LLAMA = "llama.cpp"


def _cpu_bench() -> Any:
    """bench/cpu.py, whose llama.cpp contender this bench shares."""
    spec = importlib.util.spec_from_file_location("bench_cpu", Path(__file__).with_name("cpu.py"))
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def measure(model: str, form: str, context: int, reps: int, ms: list[int],
            llama: Any = None) -> dict[str, Any]:
    import torch

    from sdcp_fast.model import cpu_pass, quant_weights
    from sdcp_fast.model.interfaces import ScoreRequest
    from sdcp_fast.model.target_scorer import ModelRunner

    lm = quant_weights.load(model, form)
    runner = ModelRunner(lm.model, num_blocks=1024)
    prompt = [(7 * i + 3) % lm.config.vocab_size for i in range(context)]
    native = cpu_pass.usable
    paths: dict[str, Any] = {"native": native, "torch": lambda *_: False}
    names = [*paths, *([LLAMA] if llama is not None else [])]
    times: dict[str, dict[int, list[float]]] = {p: {n: [] for n in [1, *(m + 1 for m in ms)]} for p in names}
    if llama is not None:
        llama.prime(prompt[:-1])  # the same context: the last token is the pass's first position
    torch.set_num_threads(1)
    try:
        for _ in range(reps):
            for name in names:
                if name == LLAMA:
                    for n in times[name]:
                        times[name][n].append(llama.pass_s([prompt[-1], *[11] * (n - 1)]))
                    continue
                cpu_pass.usable = paths[name]
                runner.release(b"p")
                runner.prefill(b"p", prompt)
                for n in times[name]:
                    t = time.thread_time()
                    if n == 1:
                        runner.decode_one([(b"p", prompt)])
                    else:
                        runner.score([ScoreRequest(b"p", prompt, [11] * (n - 1))])
                    times[name][n].append(time.thread_time() - t)
    finally:
        cpu_pass.usable = native
    out: dict[str, Any] = {}
    for name, t in times.items():
        one = statistics.median(t[1])
        out[name] = {f"{n}-pos ms": {"median": 1e3 * statistics.median(v), "min": 1e3 * min(v)} for n, v in t.items()}
        out[name]["ratios"] = {m: statistics.median(t[m + 1]) / one for m in ms}
        out[name]["ratio"] = out[name]["ratios"][max(ms)]
    return out


def read_ms(nbytes: int, reps: int) -> dict[str, float]:
    """Thread CPU ms to read ``nbytes`` from memory once (a torch sum over them as int64, one
    thread; a buffer far larger than the caches): the floor of a pass bound by the weights'
    bytes, beside which the passes above show how far they are bound by compute instead."""
    import torch

    torch.set_num_threads(1)
    buf = torch.ones(max(nbytes // 8, 1), dtype=torch.int64)
    got = []
    for _ in range(max(reps, 3)):
        t = time.thread_time()
        buf.sum()
        got.append(time.thread_time() - t)
    return {"median": 1e3 * statistics.median(got), "min": 1e3 * min(got)}


def bound_table(ratios: dict[str, dict[int, float]], acceptance: list[float], goals: list[float],
                draft_cost: float) -> list[str]:
    """For each path and M: the pass ratio, the bound at each acceptance, the acceptance each
    goal needs."""
    head = (f"  {'path':<16}{'M':>3}{'c(M)':>7}" + "".join(f"{f'a={a:g}':>8}" for a in acceptance)
            + "".join(f"{f'a for {g:g}x':>11}" for g in goals))
    lines = [f"speculation bound per pass: (1 - a^(M+1)) / (1 - a) tokens over c(M) + M x {draft_cost:g} "
             f"(the drafting), for acceptance a; and the a each goal needs ('-': not even a = 1)", head]
    for name, by_m in ratios.items():
        for m, c in by_m.items():
            cells = [speedup_bound(a, m, draft_cost, c, 1.0) or 0.0 for a in acceptance]
            need = [acceptance_needed(g, m, draft_cost, c, 1.0) for g in goals]
            lines.append(f"  {name:<16}{m:>3}{c:>7.2f}" + "".join(f"{x:>7.2f}x" for x in cells)
                         + "".join(f"{'-' if a is None else f'{a:.2f}':>11}" for a in need))
    return lines


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2")
    p.add_argument("--weights", default="q4,f32")
    p.add_argument("--context", type=int, default=64, help="tokens before the measured passes' positions")
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--m", default="1,2,3,4", help="draft lengths M: passes over M + 1 positions")
    p.add_argument("--skip-llama", action="store_true", help="leave llama.cpp out")
    p.add_argument("--acceptance", default="0.1,0.2,0.45,0.66",
                   help="per-token acceptances for the bound (measured: docs/measurements.md, 'CPU target')")
    p.add_argument("--goals", default="1.3,1.5", help="speedups whose needed acceptance is printed")
    p.add_argument("--draft-cost", type=float, default=0.0,
                   help="a drafted token's cost in one-position target passes (0: the n-gram drafter)")
    p.add_argument("--out", default=None, help="write the figures as JSON here too")
    args = p.parse_args(argv)
    from sdcp_fast.kernels import rowwise

    if not rowwise.available():
        from sdcp_fast import native

        print(f"the native pass is unavailable: {native.status()}")
        return 1
    ms = sorted({int(m) for m in args.m.split(",") if m.strip()})
    cpu = _cpu_bench()
    from sdcp_fast.model import loader

    path = loader.resolve(args.model)
    why_llama = "--skip-llama" if args.skip_llama else cpu._llama_unavailable(path)
    llama = None if why_llama else cpu.LlamaCpp(path, 1)
    command = f"python bench/cpu_pass.py {' '.join(sys.argv[1:] if argv is None else argv)}"
    res: dict[str, Any] = {"command": command, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                           "load_average": os.getloadavg(), "forms": {}, "notes": []}
    if why_llama:
        res["notes"].append(f"llama.cpp skipped: {why_llama}")
    else:
        res["llama_cpp"] = {"binding": llama.c.name, "system_info": llama.c.system_info}
    print(f"# {command}  ({res['date']}, load average {res['load_average'][0]:.1f})")
    print("thread CPU ms per pass over n positions, median (min); 1 thread; ratios: (M+1)-position / 1-position "
          "medians")
    ratios: dict[str, dict[int, float]] = {}
    try:
        for i, form in enumerate(args.weights.split(",")):
            res["forms"][form] = r = measure(args.model, form, args.context, args.reps, ms,
                                             llama if i == 0 else None)
            for name in r:
                cells = "".join(f"  {n}: {v['median']:6.2f} ({v['min']:.2f})"
                                for n, v in ((k.split('-')[0], v) for k, v in r[name].items() if k.endswith("ms")))
                rat = " ".join(f"{x:.2f}" for x in r[name]["ratios"].values())
                label = f"{LLAMA} (GGUF)" if name == LLAMA else f"{form} {name}"
                print(f"  {label:<16}{cells}   ratios M={ms[0]}..{ms[-1]}: {rat}")
                ratios[label] = r[name]["ratios"]
            speed = r["torch"]["1-pos ms"]["median"] / r["native"]["1-pos ms"]["median"]
            print(f"  {form:5} native pass {speed:.2f}x faster than torch at one position")
    finally:
        if llama is not None:
            llama.close()
    first = args.weights.split(",")[0]
    nbytes = path.stat().st_size if path.is_file() else 0
    if nbytes:
        res["read_ms"] = rd = read_ms(nbytes, args.reps)
        print(f"reading {nbytes / 1e6:.0f} MB ({path.name}'s bytes) from memory once: {rd['median']:.2f} "
              f"({rd['min']:.2f}) ms, thread CPU time, 1 thread (a torch sum over them as int64)")
    side = [f"ours {first} (native) {ratios[f'{first} native'][max(ms)]:.2f}x"]
    if LLAMA in res["forms"][first]:
        side.append(f"llama.cpp {ratios[f'{LLAMA} (GGUF)'][max(ms)]:.2f}x")
    print(f"pass over {max(ms) + 1} positions / 1-position pass, side by side: " + ", ".join(side))
    table_paths = {k: v for k, v in ratios.items() if k.endswith("native") or k.startswith(LLAMA)}
    for line in bound_table(table_paths, _floats(args.acceptance), _floats(args.goals), args.draft_cost):
        print(line)
    for n in res["notes"]:
        print(f"note: {n}")
    if "llama_cpp" in res:
        print(f"llama.cpp through {res['llama_cpp']['binding']}: {res['llama_cpp']['system_info']}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
