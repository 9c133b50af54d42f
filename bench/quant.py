"""The quantized product alone (``sdcp_fast.kernels.quant``, the ``cpu`` backend), at
SmolLM2-135M's shapes and 1, 2, 5 and 8 activation rows, 1 thread: microseconds per product
(thread CPU time, robust to a shared machine's preemption; median and minimum of ``--reps``
rounds of ``--calls`` calls, 1/20 of them for the head), nanoseconds per (row, block, output
row), and each row count's cost against one row's.

``--pass-split``: instead, where a real pass's time goes: SmolLM2 at ``--weights q4`` through
the row-invariant CPU pass after ``--context`` tokens, thread CPU time of a one-position pass and
of a pass over 5 positions, and the part of it spent in the quantized products (the layers'
and the head's calls, timed around each call).

``--trees A B ...`` runs the same measurement on several source trees (each with its own built
extension), alternated round by round in separate processes, so that a before/after comparison
shares the machine's load; the table then has one column group per tree.

    python bench/quant.py
    python bench/quant.py --trees /tmp/base /work/main --rounds 3
    python bench/quant.py --pass-split --reps 7
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

# (N, K, kind): q|k|v fused, the attention output, gate|up fused, down, the tied head (Q8_0 in the GGUF).
SHAPES = [(960, 576, "q4_1"), (576, 576, "q4_1"), (3072, 576, "q4_1"), (576, 1536, "q4_1"), (49152, 576, "q8_0")]
ROWS = (1, 2, 5, 8)


def measure(calls: int, reps: int) -> dict[str, list[float]]:
    """Median microseconds per product, by ``"N x K kind, rows"``."""
    import torch

    from sdcp_fast.kernels import quant

    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    out: dict[str, list[float]] = {}
    for n, k, kind in SHAPES:
        f = quant.launcher(quant.quantize(torch.randn(n, k, generator=g), kind), backend="cpu")
        reps_n = calls if n < 10000 else max(1, calls // 20)
        for rows in ROWS:
            x = torch.randn(rows, k, generator=g)
            f(x)
            got = []
            for _ in range(reps):
                c = time.thread_time()
                for _ in range(reps_n):
                    f(x)
                got.append((time.thread_time() - c) / reps_n * 1e6)
            out[f"{n} x {k} {kind}, {rows}"] = got
    return out


def pass_split(model: str, context: int, reps: int) -> dict[str, list[list[float]]]:
    """Per pass size: [pass ms, of which quantized products ms] for each repeat."""
    import torch

    from sdcp_fast.model import cpu_pass, quant_weights
    from sdcp_fast.model.interfaces import ScoreRequest
    from sdcp_fast.model.target_scorer import ModelRunner

    lm = quant_weights.load(model, "q4")
    runner = ModelRunner(lm.model, num_blocks=1024)
    prompt = [(7 * i + 3) % lm.config.vocab_size for i in range(context)]
    spent = [0.0]

    def timed(f: Any) -> Any:
        def call(*args: Any) -> Any:
            t = time.thread_time()
            out = f(*args)
            spent[0] += time.thread_time() - t
            return out
        return call

    patched = [(cpu_pass._Linear, "__call__"), (quant_weights.QuantLinear, "forward")]
    saved = [getattr(cls, name) for cls, name in patched]
    for (cls, name), f in zip(patched, saved, strict=True):
        setattr(cls, name, timed(f))
    torch.set_num_threads(1)
    got: dict[str, list[list[float]]] = {"1": [], "5": []}
    try:
        for _ in range(reps):
            runner.release(b"p")
            runner.prefill(b"p", prompt)
            for n in (1, 5):
                spent[0] = 0.0
                t = time.thread_time()
                if n == 1:
                    runner.decode_one([(b"p", prompt)])
                else:
                    runner.score([ScoreRequest(b"p", prompt, [11] * (n - 1))])
                got[str(n)].append([1e3 * (time.thread_time() - t), 1e3 * spent[0]])
    finally:
        for (cls, name), f in zip(patched, saved, strict=True):
            setattr(cls, name, f)
    return got


def split_table(got: dict[str, list[list[float]]]) -> str:
    lines = ["| positions | pass ms, median (min) | quantized products ms | the rest ms |", "| --- | --- | --- | --- |"]
    for n, v in got.items():
        total, prod = [x[0] for x in v], [x[1] for x in v]
        rest = [a - b for a, b in v]
        lines.append(f"| {n} | {statistics.median(total):.2f} ({min(total):.2f}) | {statistics.median(prod):.2f} "
                     f"({min(prod):.2f}) | {statistics.median(rest):.2f} ({min(rest):.2f}) |")
    return "\n".join(lines)


def table(results: dict[str, dict[str, list[float]]]) -> str:
    trees = list(results)
    head = ["shape, rows"]
    for t in trees:
        head += [f"{t}: us (median, min)", "ns per row-block-column", "x 1 row"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for key in results[trees[0]]:
        shape, rows = key.rsplit(", ", 1)
        n, _, k = shape.split()[:3]
        blocks = int(rows) * int(n) * int(k) // 32
        cells = [key]
        for t in trees:
            v = results[t][key]
            one = statistics.median(results[t][f"{shape}, 1"])
            med = statistics.median(v)
            cells += [f"{med:.1f} ({min(v):.1f})", f"{med * 1e3 / blocks:.3f}", f"{med / one:.2f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trees", nargs="*", default=[], help="source trees to compare, alternated")
    p.add_argument("--rounds", type=int, default=3, help="alternations of the trees")
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--json", action="store_true", help="print the raw figures as JSON (one tree)")
    p.add_argument("--pass-split", action="store_true", help="the products' share of a real pass instead")
    p.add_argument("--model", default="smollm2")
    p.add_argument("--context", type=int, default=64, help="cached tokens before the measured passes")
    a = p.parse_args(argv)
    if a.pass_split:
        print(split_table(pass_split(a.model, a.context, a.reps)))
        return 0
    if not a.trees:
        got = measure(a.calls, a.reps)
        print(json.dumps(got) if a.json else table({"this tree": got}))
        return 0
    results: dict[str, dict[str, list[float]]] = {t: {} for t in a.trees}
    for _ in range(a.rounds):
        for t in a.trees:
            env = dict(os.environ, PYTHONPATH=t)
            run = subprocess.run([sys.executable, os.path.abspath(__file__), "--json", "--calls", str(a.calls),
                                  "--reps", str(a.reps)], env=env, cwd=t, check=True, capture_output=True, text=True)
            got: dict[str, Any] = json.loads(run.stdout.strip().splitlines()[-1])
            for key, v in got.items():
                results[t].setdefault(key, []).extend(v)
    print(table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
