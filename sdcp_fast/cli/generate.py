"""``sdcp-fast generate``: in-process speculative decoding of one prompt (no HTTP)."""

from __future__ import annotations

import argparse
import json
import sys

HELP = "generate text with a target model and a drafter, in process (speculative decoding)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="smollm2", help="target: a GGUF file, an HF directory, or 'smollm2'")
    p.add_argument("--prompt", required=True)
    p.add_argument("--max-new", type=int, default=64)
    p.add_argument("--drafter", default="ngram", help="none | ngram | layerskip:L | model:PATH (default ngram)")
    p.add_argument("--m", type=int, default=4,
                   help="tokens proposed per round (default 4; 0: the drafter chooses M by §6.2 from measured costs)")
    p.add_argument("--rule", type=int, choices=(1, 2), default=1, help="1 greedy, 2 speculative sampling")
    p.add_argument("--temperature", type=float, default=None)
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--seed", type=int, default=None,
                   help="rule 2: seed of the verifier's randoms (§6.4); the same seed gives the same text")
    p.add_argument("--backend", default="auto", help="kernel backend: auto, reference, cpu, triton")
    p.add_argument("--raw", action="store_true", help="do not wrap the prompt in the model's chat template")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    from sdcp_fast.cli._options import add_device_argument

    add_device_argument(p)
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the text")


def run(args: argparse.Namespace) -> int:
    import torch

    from sdcp_fast.deploy.catalog import load_drafter, load_target
    from sdcp_fast.deploy.local import generate
    from sdcp_fast.protocol import Sampling

    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        target = load_target(args.model, args.device, args.weights)
        drafter = None if args.drafter == "none" else load_drafter(args.drafter, target)[0]
    except (FileNotFoundError, ValueError) as exc:
        print(f"sdcp-fast generate: {exc}", file=sys.stderr)
        return 2
    prompt = target.prompt(args.prompt, raw=args.raw)
    sampling = None
    if args.rule == 2:
        sampling = Sampling(
            temperature_milli=None if args.temperature is None else round(args.temperature * 1000),
            top_k=args.top_k, top_p_milli=None if args.top_p is None else round(args.top_p * 1000), seed=args.seed)
    res = generate(target.scorer, drafter, [prompt], args.max_new, m=args.m or None, rule=args.rule,
                   sampling=sampling, stop=target.stop, seed=args.seed or 0, backend=args.backend,
                   target_digest=target.digest)[0]
    out = target.decode(res.tokens)
    if args.json:
        print(json.dumps({"tokens": res.tokens, "text": out, "accepted": res.accepted, "proposed": res.proposed,
                          "rounds": res.rounds, "self_decoded": res.self_decoded, "seconds": round(res.seconds, 4),
                          "drafter": args.drafter, "digest": res.digest.hex(), "chain_ok": res.chain_ok}))
    else:
        print(out)
        print(f"[{len(res.tokens)} tokens, {res.rounds} rounds, accepted {res.accepted}/{res.proposed}, "
              f"{len(res.tokens) / max(res.seconds, 1e-9):.1f} tokens/s]", file=sys.stderr)
    return 0
