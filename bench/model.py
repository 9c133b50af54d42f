"""Speculative decoding on the real model, in process: a preset of ``sdcp-fast bench``
(docs/benchmarks.md), kept for the commands docs/models.md quotes.

Target-only decoding against each drafter (rule 1, fixed M) on SmolLM2-135M-Instruct and
the built-in eval prompts (``--prompt-set eval``), at batch 1 and batch 8, with the speedup next to the bound from the
measured acceptance and costs, and HF assisted generation where transformers is installed
(``--no-hf``: not). Options of the old script map onto the harness's (``--batches`` is
``--sessions``); the report and plots go to ``--out``.

    python bench/model.py                       # all drafters, 12 prompts, 48 new tokens
    python bench/model.py --quick               # 4 prompts, 24 tokens, batch 1 only

``--synthetic NAME`` (a shape of ``sdcp_fast.model.config.CONFIGS``, e.g. ``llama-3.2-1b``)
times the model runner itself on random weights, so no checkpoint has to travel: a decode
step (one token per session, argmax read back as the engine does) at each batch, eagerly
and replaying CUDA graphs, a verify pass of M + 1 rows against a decode step, and Hugging
Face transformers' greedy ``generate`` on the same weights where it is installed, with the
bound of reading the weights once per step at the copy bandwidth measured in the same run.

    python bench/model.py --synthetic llama-3.2-1b --device cuda     # the runner's GPU goals
    python bench/model.py --synthetic tiny-target --batches 1,4      # the same on CPU, seconds
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from sdcp_fast.benchlib import bench_report
from sdcp_fast.benchlib import workload as wl
from sdcp_fast.benchlib.run import Plan, finish, run
from sdcp_fast.deploy.catalog import check_device, resolve


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2")
    p.add_argument("--drafters", default="ngram,layerskip:4,model:smollm2-draft")
    p.add_argument("--prompts", default="12")
    p.add_argument("--max-new", default="48")
    p.add_argument("--m", default="4")
    p.add_argument("--batches", default="1,8")
    p.add_argument("--threads", default="2")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--device", default="cpu", help="cpu or cuda (the target and the drafters sharing it)")
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "model")
    p.add_argument("--synthetic", metavar="SHAPE", help="time the runner on random weights of this shape instead")
    p.add_argument("--prompt-len", type=int, default=128, help="--synthetic: tokens cached per session (default 128)")
    p.add_argument("--steps", type=int, default=16, help="--synthetic: timed steps per measurement (default 16)")
    p.add_argument("--attention", default="auto", help="--synthetic: the runner's attention (auto, sdpa, triton, "
                                                       "reference)")
    p.add_argument("--no-hf", action="store_true", help="skip HF transformers assisted generation")
    p.add_argument("--backend", default="auto", help="kernel backend: auto, reference, cpu, triton")
    args = p.parse_args(argv)
    if args.synthetic:
        return synthetic(args)
    if args.quick:
        args.prompts, args.max_new, args.batches = "4", "24", "1"
    return preset(args, "python bench/model.py " + shlex.join(sys.argv[1:] if argv is None else argv))


def preset(args: argparse.Namespace, command: str) -> int:
    """The harness's in-process configurations, one repeat each, on the eval prompts."""
    import torch

    try:
        check_device(args.device)
        model = resolve(args.model)
        if args.device != "cpu" and model == "toy":
            raise ValueError("--device: the toy target has no weights to move")
    except ValueError as exc:
        print(f"bench/model.py: {exc}", file=sys.stderr)
        return 2
    torch.set_num_threads(int(args.threads))
    prompts = wl.take(wl.builtin(model == "toy", eval_set=True), int(args.prompts))
    plan = Plan(model=model, drafters=[d for d in args.drafters.split(",") if d],
                levels=[int(b) for b in args.batches.split(",")], repeats=1,
                workload=wl.Workload(prompts, int(args.max_new)), inprocess=True, embedded=False, m=int(args.m),
                variants=False, hf=not args.no_hf, backend=args.backend, device=args.device, timeout=900.0,
                command=command)
    print(f"bench/model.py: {model}, {plan.workload.describe()}, sessions {args.batches}, one repeat, warm-up "
          "excluded", flush=True)
    report = run(plan)
    written = finish(report, args.out)
    print()
    print(bench_report.text(report))
    print("written: " + ", ".join(str(p) for p in written))
    return 0


def synthetic(args: argparse.Namespace) -> int:
    import json
    import statistics
    import time

    import torch

    from sdcp_fast.model.config import CONFIGS
    from sdcp_fast.model.interfaces import ScoreRequest, per_request
    from sdcp_fast.model.llama import Transformer, rope_inv_freq
    from sdcp_fast.model.target_scorer import ModelRunner

    try:
        check_device(args.device)
        if args.synthetic not in CONFIGS:
            raise ValueError(f"--synthetic: unknown shape {args.synthetic!r} (one of {', '.join(CONFIGS)})")
    except ValueError as exc:
        print(f"bench/model.py: {exc}", file=sys.stderr)
        return 2
    torch.set_num_threads(int(args.threads))
    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    cfg = CONFIGS[args.synthetic]
    batches = [int(b) for b in args.batches.split(",")]
    m, plen, steps = int(args.m), args.prompt_len, args.steps
    torch.manual_seed(0)
    with torch.device(dev):
        model = Transformer(cfg).to(dtype)
    with torch.no_grad():
        for name, w in model.named_parameters():
            w.copy_(torch.ones_like(w) if "norm" in name else torch.randn_like(w) * 0.02)
    model.inv_freq = rope_inv_freq(cfg).to(dev)
    model.eval().requires_grad_(False)
    weight_bytes = sum(w.numel() * w.element_size() for w in model.parameters())

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    def copy_gbs() -> float:
        a = torch.empty(256 << 20 if cuda else 64 << 20, dtype=torch.uint8, device=dev)
        b = torch.empty_like(a)
        best = float("inf")
        for _ in range(5):
            sync()
            t0 = time.perf_counter()
            b.copy_(a)
            sync()
            best = min(best, time.perf_counter() - t0)
        return 2 * a.numel() / best / 1e9

    def runner_row(batch: int, graphs: bool | None) -> dict[str, float]:
        blocks = batch * (-(-(plen + steps + 2 * m + 8) // 16)) + 16
        kw = {} if graphs is None else {"cuda_graphs": graphs}
        r = ModelRunner(model, num_blocks=blocks, attention=args.attention, **kw)
        gen = torch.Generator().manual_seed(batch)
        ctx = {bytes([i % 256, i // 256]): torch.randint(0, cfg.vocab_size, (plen,), generator=gen).tolist()
               for i in range(batch)}
        r.decode_one(list(ctx.items()))  # prefill every session in one ragged pass

        def decode() -> None:
            nxt = r.decode_one(list(ctx.items())).argmax(-1).tolist()  # what the engine reads back
            for c, t in zip(ctx.values(), nxt, strict=True):
                c.append(t)

        def verify() -> None:
            reqs = [ScoreRequest(s, c, c[-m:]) for s, c in ctx.items()]
            torch.stack([x.argmax(-1) for x in per_request(r.score(reqs), reqs)]).tolist()

        out = {}
        for name, fn in (("decode", decode), ("verify", verify)):
            for _ in range(2):  # warm-up: compiles, captures
                fn()
            times = []
            for _ in range(steps):  # each step ends reading its tokens on the host, as the engine's do
                sync()
                t0 = time.perf_counter()
                fn()
                sync()
                times.append(time.perf_counter() - t0)
            out[f"{name}_ms"] = statistics.median(times) * 1e3
        out["graph_captures"] = r.graphs.captures if r.graphs is not None else 0
        return out

    def hf_row(batch: int, hf: object) -> float | None:
        gen = torch.Generator().manual_seed(batch)
        ids = torch.randint(0, cfg.vocab_size, (batch, plen), generator=gen).to(dev)
        times = {}
        for n in (1, steps + 1):
            hf.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False)  # type: ignore[attr-defined]
            best = float("inf")
            for _ in range(3):
                sync()
                t0 = time.perf_counter()
                hf.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False)  # type: ignore[attr-defined]
                sync()
                best = min(best, time.perf_counter() - t0)
            times[n] = best
        return (times[steps + 1] - times[1]) / steps * 1e3  # per decode step, prefill taken out

    hf = None
    try:
        from transformers import LlamaConfig, LlamaForCausalLM

        from sdcp_fast.model import weights

        shape = dict(vocab_size=cfg.vocab_size, hidden_size=cfg.dim, num_hidden_layers=cfg.n_layers,
                     num_attention_heads=cfg.n_heads, num_key_value_heads=cfg.n_kv_heads,
                     intermediate_size=cfg.ffn_dim, rms_norm_eps=cfg.norm_eps, rope_theta=cfg.rope_theta,
                     tie_word_embeddings=cfg.tie_embeddings, max_position_embeddings=cfg.max_seq_len,
                     pad_token_id=0, eos_token_id=None)
        try:
            hfc = LlamaConfig(**shape, rope_scaling=cfg.rope_scaling)
        except Exception:  # noqa: BLE001 - versions name it differently; it does not change the cost
            hfc = LlamaConfig(**shape)
        with torch.device(dev):
            hf = LlamaForCausalLM(hfc).to(dtype).eval()
        hf.load_state_dict({weights.to_hf_name(k): v for k, v in model.state_dict().items()}, strict=False)
        if cfg.tie_embeddings:
            hf.tie_weights()
    except Exception as exc:  # noqa: BLE001 - the runner's figures stand without the peer's
        hf = None
        print(f"bench/model.py: no HF comparison ({type(exc).__name__}: {exc})", file=sys.stderr)

    attention = ModelRunner(model, num_blocks=1, attention=args.attention).attention
    bw = copy_gbs()
    bound_ms = weight_bytes / (bw / 2 * 1e9) * 1e3  # the weights read once per step
    rows = []
    for batch in batches:
        row: dict[str, object] = {"batch": batch}
        modes = [("eager", False), ("graphs", True)] if attention == "triton" and cuda else [("eager", False)]
        for label, graphs in modes:
            for k, v in runner_row(batch, graphs).items():
                row[f"{label}_{k}"] = round(v, 3) if isinstance(v, float) else v
        best = min(float(row[f"{label}_decode_ms"]) for label, _ in modes)  # type: ignore[arg-type]
        row["tokens_per_s"] = round(batch / best * 1e3, 1)
        row["verify_over_decode"] = round(min(float(row[f"{lb}_verify_ms"]) for lb, _ in modes)  # type: ignore[arg-type]
                                          / best, 2)
        if hf is not None:
            with torch.inference_mode():
                hf_ms = hf_row(batch, hf)
            row["hf_decode_ms"] = round(hf_ms, 3)
            row["speedup_over_hf"] = round(hf_ms / best, 2)
        rows.append(row)
        print(json.dumps(row), flush=True)
    report = {
        "shape": args.synthetic, "device": str(dev), "dtype": str(dtype).removeprefix("torch."),
        "attention": attention,
        "gpu": torch.cuda.get_device_name(dev) if cuda else None, "torch": torch.__version__,
        "prompt_len": plen, "m": m, "steps": steps, "weight_gb": round(weight_bytes / 1e9, 3),
        "copy_gbs": round(bw, 1), "weight_bound_ms": round(bound_ms, 3), "rows": rows,
        "goals": "B=1 decode >= 500 tokens/s (llama-3.2-1b on an H200), >= 5x HF; verify (M=4) <= 1.3x a "
                 "decode step; B=64 >= 5x HF",
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"runner-{args.synthetic}-{dev.type}-{report['attention']}.json"
    path.write_text(json.dumps(report, indent=1) + "\n")
    print(f"weights {report['weight_gb']} GB, copy {report['copy_gbs']} GB/s: bound {report['weight_bound_ms']} ms "
          f"per step; wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
