"""Where a CPU pass's time goes: the row-invariant native pass (``model/cpu_pass.py``) against
the torch modules it replaces, on the same model in one process, interleaved.

For each ``--weights`` form: thread CPU time (robust to a shared machine's preemption) of a
one-position pass and of a verification pass over M + 1 = 5 positions after ``--context``
cached tokens, median and minimum over ``--reps`` rounds, each round running both paths; and
the 5-position / 1-position ratio of each path. 1 thread.

    python bench/cpu_pass.py                       # SmolLM2, q4 and f32
    python bench/cpu_pass.py --weights q4 --reps 20
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any


def measure(model: str, form: str, context: int, reps: int) -> dict[str, Any]:
    import torch

    from sdcp_fast.model import cpu_pass, quant_weights
    from sdcp_fast.model.interfaces import ScoreRequest
    from sdcp_fast.model.target_scorer import ModelRunner

    lm = quant_weights.load(model, form)
    runner = ModelRunner(lm.model, num_blocks=1024)
    prompt = [(7 * i + 3) % lm.config.vocab_size for i in range(context)]
    native = cpu_pass.usable
    paths = {"native": native, "torch": lambda *_: False}
    times: dict[str, dict[str, list[float]]] = {p: {"1": [], "5": []} for p in paths}
    torch.set_num_threads(1)
    try:
        for _ in range(reps):
            for name, usable in paths.items():
                cpu_pass.usable = usable
                runner.release(b"p")
                runner.prefill(b"p", prompt)
                t = time.thread_time()
                runner.decode_one([(b"p", prompt)])
                times[name]["1"].append(time.thread_time() - t)
                t = time.thread_time()
                runner.score([ScoreRequest(b"p", prompt, [11] * 4)])
                times[name]["5"].append(time.thread_time() - t)
    finally:
        cpu_pass.usable = native
    out: dict[str, Any] = {}
    for name, t in times.items():
        out[name] = {f"{n}-pos ms": {"median": 1e3 * statistics.median(v), "min": 1e3 * min(v)} for n, v in t.items()}
        out[name]["ratio"] = statistics.median(t["5"]) / statistics.median(t["1"])
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2")
    p.add_argument("--weights", default="q4,f32")
    p.add_argument("--context", type=int, default=48, help="cached tokens before the measured passes")
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--out", default=None, help="write the figures as JSON here too")
    args = p.parse_args(argv)
    from sdcp_fast.kernels import rowwise

    if not rowwise.available():
        from sdcp_fast import native

        print(f"the native pass is unavailable: {native.status()}")
        return 1
    res = {}
    print(f"# python bench/cpu_pass.py {' '.join(sys.argv[1:] if argv is None else argv)}  ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})")
    print("thread CPU ms per pass, median (min); 5/1: ratio of medians")
    for form in args.weights.split(","):
        res[form] = r = measure(args.model, form, args.context, args.reps)
        for name in ("native", "torch"):
            one, five = r[name]["1-pos ms"], r[name]["5-pos ms"]
            print(f"  {form:5} {name:6}  1 position {one['median']:7.2f} ({one['min']:.2f})   "
                  f"5 positions {five['median']:7.2f} ({five['min']:.2f})   5/1 {r[name]['ratio']:.2f}")
        speed = r["torch"]["1-pos ms"]["median"] / r["native"]["1-pos ms"]["median"]
        print(f"  {form:5} native pass {speed:.2f}x faster at one position")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
