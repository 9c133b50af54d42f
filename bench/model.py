"""Speculative decoding on the real model, in process: a preset of the roles (router,
verifier, drafters) on the in-process transport, the same path as ``sdcp-fast generate``.

Tokens/s of target-only greedy decoding against speculative decoding (rule 1) with each
drafter, at batch 1 (prompts one after another) and batch 8 (one batched target pass per
round), on SmolLM2-135M-Instruct and the built-in prompt set. Next to each measured speedup:
the bound predicted from the measured acceptance a and costs,
``(1 - a^(M+1)) / (1 - a)`` tokens per round divided by the round's cost
(``M * t_draft + t_verify``) in target-only passes. With transformers installed (extra
``[compare]``), HF assisted generation with the same target and draft runs in the same run.
Targets (reported, not asserted): speculative >= 1.5x target-only at batch 1 with the best
drafter; >= 2x faster than HF assisted generation on the same pair.

    python bench/model.py                       # all drafters, 12 prompts, 48 new tokens
    python bench/model.py --quick               # 4 prompts, 24 tokens, batch 1 only
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

import torch

from sdcp_fast import data
from sdcp_fast.engine.inprocess import generate
from sdcp_fast.model import loader
from sdcp_fast.model.build import make_drafter, stop_tokens
from sdcp_fast.model.runner import ModelRunner
from sdcp_fast.model.tokenizer import chat_prompt, encode


class Timed:
    """Wraps a drafter or scorer method to add up the seconds spent in it."""

    def __init__(self, obj: Any, method: str) -> None:
        self.seconds, self.calls = 0.0, 0
        inner = getattr(obj, method)

        def timed(*a: Any, **kw: Any) -> Any:
            t = time.perf_counter()
            try:
                return inner(*a, **kw)
            finally:
                self.seconds += time.perf_counter() - t
                self.calls += 1

        setattr(obj, method, timed)


def bound(a: float, m: int, t_draft: float, t_verify: float, t_pass: float) -> float:
    per_round = m + 1 if a >= 1 else (1 - a ** (m + 1)) / (1 - a)
    return per_round / ((m * t_draft + t_verify) / t_pass)


def run_case(lm: loader.LoadedModel, spec: str, prompts: list[list[int]], batch: int, max_new: int,
             m: int) -> dict[str, Any]:
    target = ModelRunner(lm.model)
    drafter = make_drafter(spec, lm)
    score_t = Timed(target, "score")
    draft_t = Timed(drafter, "propose") if drafter is not None else None
    stop = stop_tokens(lm)
    results = []
    t0 = time.perf_counter()
    for i in range(0, len(prompts), batch):
        results += generate(target, drafter, prompts[i:i + batch], max_new, m=m, stop=stop, seed=i)
    wall = time.perf_counter() - t0
    tokens = sum(len(r.tokens) for r in results)
    proposed = sum(r.proposed for r in results)
    out = {"drafter": spec, "batch": batch, "tokens": tokens, "seconds": wall, "tokens_per_s": tokens / wall,
           "target_passes": score_t.calls,
           # per session: tokens committed per target pass it took part in
           "tokens_per_pass": tokens / max(1, sum(r.rounds for r in results)),
           "acceptance": sum(r.accepted for r in results) / proposed if proposed else None,
           "t_verify": score_t.seconds / max(1, score_t.calls),
           "t_draft_token": (draft_t.seconds / max(1, proposed)) if draft_t else None,
           "outputs": [r.tokens for r in results]}
    return out


def hf_assisted(lm: loader.LoadedModel, draft_spec: str, prompts: list[list[int]], max_new: int) -> dict[str, Any]:
    """transformers' assisted generation with the same target GGUF and the same draft."""
    import tempfile

    from transformers import AutoModelForCausalLM

    path = loader.smollm2_path()
    hf_target = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    res: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        assistant = None
        if draft_spec.startswith("model"):
            d = loader.load(draft_spec.partition(":")[2] or "smollm2-draft", borrow=lm.model)
            loader.save_hf_dir(d.model, Path(tmp), dtype=torch.float32)  # embedding included
            assistant = AutoModelForCausalLM.from_pretrained(tmp, dtype=torch.float32)
        for label, kw in [("hf-greedy", {}), (f"hf-assisted:{draft_spec}", {"assistant_model": assistant})]:
            if label.startswith("hf-assisted") and assistant is None:
                kw = {"prompt_lookup_num_tokens": 4}  # HF's n-gram drafter
            t0, tokens = time.perf_counter(), 0
            for ids in prompts:
                out = hf_target.generate(torch.tensor([ids]), max_new_tokens=max_new, do_sample=False,
                                         eos_token_id=stop_tokens(lm), **kw)
                tokens += out.shape[1] - len(ids)
            wall = time.perf_counter() - t0
            res[label] = {"tokens": tokens, "seconds": wall, "tokens_per_s": tokens / wall}
    return res


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2")
    p.add_argument("--drafters", default="ngram,layerskip:4,model:smollm2-draft")
    p.add_argument("--prompts", type=int, default=12)
    p.add_argument("--max-new", type=int, default=48)
    p.add_argument("--m", type=int, default=4)
    p.add_argument("--batches", default="1,8")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--no-hf", action="store_true")
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = p.parse_args(argv)
    if args.quick:
        args.prompts, args.max_new, args.batches = 4, 24, "1"
    torch.set_num_threads(args.threads)
    lm = loader.load(args.model)
    assert lm.tokenizer is not None
    prompts = [encode(lm.tokenizer, chat_prompt(q["text"])) for q in data.prompts("eval")][: args.prompts]
    drafters = [d for d in args.drafters.split(",") if d]
    if "model:smollm2-draft" in drafters and not loader.shipped_path("smollm2-draft").is_dir():
        print("skipping model:smollm2-draft: not shipped yet (sdcp-fast distill)", file=sys.stderr)
        drafters.remove("model:smollm2-draft")
    rows = []
    for batch in [int(b) for b in args.batches.split(",")]:
        base = run_case(lm, "none", prompts, batch, args.max_new, args.m)
        rows.append(base)
        t_pass = base["t_verify"]
        print(f"batch {batch}: target-only {base['tokens_per_s']:.1f} tok/s ({t_pass * 1000:.0f} ms/pass)")
        for spec in drafters:
            r = run_case(lm, spec, prompts, batch, args.max_new, args.m)
            r["same_as_greedy"] = r["outputs"] == base["outputs"]
            r["speedup"] = r["tokens_per_s"] / base["tokens_per_s"]
            a = r["acceptance"] or 0.0
            r["bound"] = bound(a, args.m, r["t_draft_token"] or 0.0, r["t_verify"], t_pass)
            rows.append(r)
            print(f"batch {batch}: {spec:24s} {r['tokens_per_s']:6.1f} tok/s  accept {a:.3f}  "
                  f"tok/pass {r['tokens_per_pass']:.2f}  speedup {r['speedup']:.2f}x  (bound {r['bound']:.2f}x)  "
                  f"same-as-greedy {r['same_as_greedy']}")
    hf = {}
    if not args.no_hf and importlib.util.find_spec("transformers") is not None:
        best = max((r for r in rows if r["batch"] == 1 and r["drafter"] != "none"), key=lambda r: r["speedup"],
                   default=None)
        if best is not None:
            hf = hf_assisted(lm, best["drafter"], prompts, args.max_new)
            ours = best["tokens_per_s"]
            for label, h in hf.items():
                print(f"batch 1: {label:24s} {h['tokens_per_s']:6.1f} tok/s   ours/HF {ours / h['tokens_per_s']:.2f}x")
    print("targets: speculative >= 1.5x target-only at batch 1 (best drafter); >= 2x HF assisted generation")
    args.out.mkdir(parents=True, exist_ok=True)
    for r in rows:
        r.pop("outputs", None)
    (args.out / "model-cpu.json").write_text(json.dumps({"machine": platform.machine(), "threads": args.threads,
                                                          "m": args.m, "max_new": args.max_new, "rows": rows,
                                                          "hf": hf}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
