"""``sdcp-fast bench``: tokens/s, latency percentiles, acceptance and speedup of SDCP decoding,
in process, against the embedded deployment (``sdcp-fast up`` on loopback) or a running one,
with a report (``report.json`` with the raw samples and the environment) and plots.
docs/benchmarks.md says what each figure means."""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path
from typing import Any

HELP = "measure tokens/s, latency, acceptance and speedup (in process, sdcp-fast up, or a remote deployment)"

REAL_DRAFTERS = "ngram,model:smollm2-draft"
TOY_DRAFTERS = "toy-good,toy-weak"
# Sized so that the default run (every configuration, sdcp-fast up and the HF peers) ends within
# 10 minutes on the reference machine (2 shared CPU cores; docs/measurements.md has its time), and
# --quick in about a third of that with the same outputs.
DEFAULTS = {"sessions": "1,4", "prompts": 4, "max_new": 16, "repeats": 3}
QUICK = {"sessions": "1,4", "prompts": 4, "max_new": 16, "repeats": 1}


def add_arguments(p: argparse.ArgumentParser) -> None:
    where = p.add_mutually_exclusive_group()
    where.add_argument("--embedded", action="store_true",
                       help="also start sdcp-fast up (every role its own process, HTTP/2 + mTLS on loopback) and "
                            "measure it next to the in-process configurations (the default)")
    where.add_argument("--inprocess", action="store_true", help="only the in-process configurations")
    where.add_argument("--router", metavar="URL", help="measure a running deployment through its front end")
    p.add_argument("--ca", help="CA certificate of the deployment (--router)")
    p.add_argument("--cert", help="client certificate (--router)")
    p.add_argument("--key", help="client key (--router)")
    p.add_argument("--metrics", action="append", default=[], metavar="URL",
                   help="a verifier's base URI whose GET metrics gives rounds and acceptance (--router; repeatable)")
    p.add_argument("--model", default=None,
                   help="target: toy, smollm2, a GGUF or HF directory (default: auto = smollm2 when installed; "
                        "with --router: none, so no in-process target-only figure)")
    p.add_argument("--drafters", default=None,
                   help=f"comma-separated drafter specs (default {REAL_DRAFTERS}; toy: {TOY_DRAFTERS})")
    p.add_argument("--sessions", default=None, help=f"concurrency levels, comma-separated (default {DEFAULTS['sessions']})")
    p.add_argument("--prompts", default=None,
                   help=f"number of built-in prompts per run (default {DEFAULTS['prompts']}, one of each kind), or a "
                        "FILE.jsonl of {\"text\", \"kind\"}")
    p.add_argument("--prompt-set", choices=("bench", "eval"), default="bench",
                   help="built-in prompts: bench (prose, code, lists, repetition; default) or eval (the chat and "
                        "copy prompts of docs/models.md)")
    p.add_argument("--max-new", type=int, default=None, help=f"output tokens per session (default {DEFAULTS['max_new']})")
    p.add_argument("--rule", type=int, choices=(1, 2), default=1, help="acceptance rule (default 1, greedy)")
    p.add_argument("--profile", default="sample", help="rule 2 sampling profile: sample, nucleus, topk")
    p.add_argument("--rate", type=float, default=None,
                   help="open loop: sessions arrive as a Poisson process at this rate per second (default: closed "
                        "loop, each level's sessions all in flight)")
    p.add_argument("--repeats", type=int, default=None, help=f"measured repeats per configuration and level (default "
                                                                    f"{DEFAULTS['repeats']})")
    p.add_argument("--m", type=int, default=4, help="the fixed M of the fixed-M configurations, sdcp-fast up's drafters' too (default 4)")
    p.add_argument("--no-variants", action="store_true", help="skip adaptive M and no-batching")
    p.add_argument("--no-hf", action="store_true", help="skip HF transformers assisted generation")
    p.add_argument("--alone", type=int, default=1, metavar="N",
                   help="pairs per prompt of each session alone (B = 1: each drafter against target-only, one "
                        "prompt at a time, interleaved); 0 skips them (default 1)")
    p.add_argument("--quick", action="store_true",
                   help=f"a short run with the same outputs: {QUICK['prompts']} prompts, {QUICK['max_new']} tokens, "
                        f"sessions {QUICK['sessions']}, one repeat, the first drafter only")
    p.add_argument("--device", default="cpu",
                   help="cpu, cuda or cuda:N: the in-process target and drafters, and the verifiers and drafters "
                        "sdcp-fast up starts (--embedded)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads of the in-process target (default: half the CPUs, so that the event "
                        "loop and other processes keep the rest)")
    p.add_argument("--backend", default="auto", help="kernel backend: auto, reference, cpu, triton")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per configuration and level at most")
    p.add_argument("--out", type=Path, default=None, help="folder for report.json and the PNGs "
                                                          "(default bench/results/<time>)")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--compare", nargs=2, type=Path, metavar=("A.json", "B.json"),
                   help="print the differences between two reports, run nothing")


def run(args: argparse.Namespace) -> int:
    from sdcp_fast.benchlib import bench_report as reports

    if args.compare:
        try:
            a, b = (reports.load(p) for p in args.compare)
        except (OSError, ValueError) as exc:
            print(f"sdcp-fast bench: {exc}", file=sys.stderr)
            return 2
        print(reports.compare(a, b))
        return 0
    try:
        plan = _plan(args)
    except ValueError as exc:
        print(f"sdcp-fast bench: {exc}", file=sys.stderr)
        return 2
    from sdcp_fast.benchlib.run import finish
    from sdcp_fast.benchlib.run import run as run_plan

    out = args.out or Path("bench/results") / time.strftime("%Y%m%d-%H%M%S")
    print(f"sdcp-fast bench: {plan.model or 'remote'}, {plan.workload.describe()}, sessions "
          f"{','.join(map(str, plan.levels))}, {plan.repeats} repeats, warm-up excluded", flush=True)
    report = _terminable(run_plan, plan)
    written = finish(report, out, plots=not args.no_plots)
    print()
    print(reports.text(report))
    print("written: " + ", ".join(str(p) for p in written))
    return 0


def _terminable(fn: Any, *args: Any) -> Any:
    """``fn(*args)`` with SIGTERM raising SystemExit, so that a terminated bench still stops the
    sdcp-fast up it started (whose processes run in sessions of their own and outlive it)."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return fn(*args)
    previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    try:
        return fn(*args)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _plan(args: argparse.Namespace) -> object:
    from sdcp_fast.benchlib import workload as wl
    from sdcp_fast.benchlib.drive_network import Remote, served_model
    from sdcp_fast.benchlib.run import Plan
    from sdcp_fast.deploy.catalog import resolve

    remote = None
    if args.router:
        if not (args.ca and args.cert and args.key):
            raise ValueError("--router needs --ca, --cert and --key")
        remote = Remote(args.router, args.ca, args.cert, args.key, list(args.metrics))
    model = resolve(args.model or "auto") if (args.model or not remote) else None
    import os

    import torch

    torch.set_num_threads(args.threads or max(1, (os.cpu_count() or 2) // 2))
    if args.device != "cpu":
        if args.device.startswith("cuda") and not torch.cuda.is_available():
            raise ValueError(f"--device {args.device}: no CUDA device here")
        if model == "toy":
            raise ValueError("--device: the toy target has no weights to move")
    # The built-in prompts in the toy model's words only for a toy target.
    toy = model == "toy" or (model is None and remote is not None and served_model(remote) == "toy")
    drafters = [d.strip() for d in (args.drafters or (TOY_DRAFTERS if toy else REAL_DRAFTERS)).split(",") if d.strip()]
    if model == "smollm2" and "model:smollm2-draft" in drafters:
        from sdcp_fast.model.loader import shipped_path

        if not shipped_path("smollm2-draft").is_dir():
            drafters.remove("model:smollm2-draft")
    quick = args.quick
    preset = QUICK if quick else DEFAULTS
    levels = [int(x) for x in (args.sessions or str(preset["sessions"])).split(",")]
    repeats = args.repeats or int(preset["repeats"])
    max_new = args.max_new or int(preset["max_new"])
    if args.prompts and Path(args.prompts).is_file():
        prompts = wl.from_file(Path(args.prompts))
    else:
        n = int(args.prompts) if args.prompts else int(preset["prompts"])
        prompts = list(wl.take(wl.builtin(toy, eval_set=args.prompt_set == "eval"), n))
    if args.rule == 2 and args.profile not in wl.PROFILES:
        raise ValueError(f"unknown profile {args.profile!r} (expected {', '.join(wl.PROFILES)})")
    workload = wl.Workload(tuple(prompts), max_new, rule=args.rule, profile=args.profile if args.rule == 2 else None,
                           rate=args.rate, seed=args.seed)
    if quick and not args.drafters and not toy:
        drafters = drafters[:1]
    if remote is not None and not args.drafters:
        drafters = []  # in process only the target-only baseline, beside the deployment
    command = ("sdcp-fast bench " + shlex.join(sys.argv[2:])) if sys.argv[1:2] == ["bench"] else \
        "sdcp-fast bench (from Python) " + shlex.join(f"--{k}={v}" for k, v in sorted(vars(args).items())
                                                      if v not in (None, False, []) and not k.startswith("_"))
    return Plan(
        model=model or "", drafters=drafters, levels=levels, repeats=repeats, workload=workload,
        inprocess=model is not None, embedded=not args.inprocess and remote is None, remote=remote,
        m=args.m, variants=not args.no_variants, hf=not args.no_hf, alone=max(0, args.alone), backend=args.backend,
        timeout=args.timeout, progress=not args.no_progress, command=command, device=args.device,
    )
