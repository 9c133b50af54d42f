"""``sdcp-fast distill``: train a small draft for a target by distillation from the target."""

from __future__ import annotations

import argparse
from pathlib import Path

HELP = "train a draft model for a target by distillation from the target's own generations (resumable)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from sdcp_fast.model.distill import DistillConfig

    d = DistillConfig()
    p.add_argument("--target", default="smollm2", help="target model: GGUF, HF directory or 'smollm2'")
    p.add_argument("--out", type=Path, required=True, help="working directory; the draft lands in OUT/draft")
    p.add_argument("--layers", type=int, default=d.n_layers, help="draft depth (initialized from the target's)")
    p.add_argument("--steps", type=int, default=d.steps)
    p.add_argument("--batch", type=int, default=d.batch)
    p.add_argument("--lr", type=float, default=d.lr)
    p.add_argument("--weight-decay", type=float, default=d.weight_decay)
    p.add_argument("--gen-tokens", type=int, default=d.gen_tokens, help="target tokens generated per prompt")
    p.add_argument("--prompts", type=int, default=d.prompts, help="training prompts (of the built-in set)")
    p.add_argument("--samples", type=int, default=d.samples,
                   help="sampled continuations per prompt besides the greedy one")
    p.add_argument("--prompt-weight", type=float, default=d.prompt_weight, help="loss weight of prompt positions")
    p.add_argument("--minutes", type=float, default=d.minutes, help="time budget; rerun the command to resume")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=None)


def run(args: argparse.Namespace) -> int:
    import torch

    from sdcp_fast.model.distill import DistillConfig, distill

    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = DistillConfig(n_layers=args.layers, steps=args.steps, batch=args.batch, lr=args.lr,
                        gen_tokens=args.gen_tokens, prompts=args.prompts, minutes=args.minutes,
                        weight_decay=args.weight_decay, samples=args.samples,
                        prompt_weight=args.prompt_weight)
    metrics = distill(args.target, args.out, cfg, args.device)
    print(f"draft written to {args.out / 'draft'}: {metrics}")
    return 0
