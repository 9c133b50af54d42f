"""``sdcp-fast distill``: train a small draft for a target by distillation from the target."""

from __future__ import annotations

import argparse
from pathlib import Path

HELP = "train a draft model for a target by distillation from the target's own generations (resumable)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from sdcp_fast.model.distill_data import DistillConfig

    d = DistillConfig()
    p.add_argument("--target", default="smollm2", help="target model: GGUF, HF directory or 'smollm2'")
    p.add_argument("--out", type=Path, required=True,
                   help="working directory; each draft lands in OUT/draft-L<layers>")
    p.add_argument("--layers", default=",".join(map(str, d.layers)),
                   help="draft depth(s), comma-separated: one draft each, trained side by side "
                        "(initialized from the target's first layers)")
    p.add_argument("--head-vocab", type=int, default=d.head_vocab,
                   help="token ids the draft's output layer covers, the target's most emitted (0: all)")
    p.add_argument("--steps", type=int, default=d.steps)
    p.add_argument("--batch-tokens", type=int, default=d.batch_tokens, help="tokens per training step")
    p.add_argument("--lr", type=float, default=d.lr)
    p.add_argument("--weight-decay", type=float, default=d.weight_decay)
    p.add_argument("--gen-tokens", type=int, default=d.gen_tokens, help="target tokens generated per prompt")
    p.add_argument("--gen-batch", type=int, default=d.gen_batch, help="prompts decoded side by side")
    p.add_argument("--prompts", type=int, default=d.prompts, help="training prompts (of the built-in set)")
    p.add_argument("--self-prompts", type=int, default=d.self_prompts,
                   help="user turns the target writes itself, then answers (widens the data)")
    p.add_argument("--copy-prompts", type=int, default=d.copy_prompts,
                   help="copy/edit/summarize prompts made from the target's own answers")
    p.add_argument("--samples", type=int, default=d.samples,
                   help="sampled answers per built-in prompt besides the greedy one")
    p.add_argument("--top-k", type=int, default=d.top_k, help="target logits kept per answer token as its label")
    p.add_argument("--extra-data", nargs="*", default=[], metavar="DATA_PT",
                   help="OUT/data.pt files of earlier runs (other seeds) whose sequences join the training set")
    p.add_argument("--seed", type=int, default=d.seed, help="seeds the self-written prompts, samples and batches")
    p.add_argument("--minutes", type=float, default=d.minutes, help="time budget; rerun the command to resume")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=None)


def run(args: argparse.Namespace) -> int:
    import torch

    from sdcp_fast.model.distill import distill
    from sdcp_fast.model.distill_data import DistillConfig

    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = DistillConfig(layers=tuple(int(n) for n in args.layers.split(",")), head_vocab=args.head_vocab, steps=args.steps,
                        batch_tokens=args.batch_tokens, lr=args.lr, weight_decay=args.weight_decay,
                        gen_tokens=args.gen_tokens, gen_batch=args.gen_batch, prompts=args.prompts,
                        self_prompts=args.self_prompts, copy_prompts=args.copy_prompts, samples=args.samples,
                        top_k=args.top_k, seed=args.seed, extra_data=tuple(args.extra_data), minutes=args.minutes)
    metrics = distill(args.target, args.out, cfg, args.device)
    print(f"drafts written to {args.out}/draft-L*: {metrics}")
    return 0
