"""Speculative decoding on the real model, in process: a preset of ``sdcp-fast bench``
(docs/benchmarks.md), kept for the commands docs/models.md quotes.

Target-only decoding against each drafter (rule 1, fixed M) on SmolLM2-135M-Instruct and
the built-in eval prompts (``--prompt-set eval``), at batch 1 and batch 8, with the speedup next to the bound from the
measured acceptance and costs, and HF assisted generation where transformers is installed.
Options of the old script map onto the harness's (``--batches`` is ``--sessions``); any other
option is passed through.

    python bench/model.py                       # all drafters, 12 prompts, 48 new tokens
    python bench/model.py --quick               # 4 prompts, 24 tokens, batch 1 only
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


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
    args, rest = p.parse_known_args(argv)
    if args.quick:
        args.prompts, args.max_new, args.batches = "4", "24", "1"
    from sdcp_fast.cli import main as cli

    return cli(["bench", "--inprocess", "--no-variants", "--repeats", "1", "--prompt-set", "eval", "--model", args.model,
                "--drafters", args.drafters, "--prompts", args.prompts, "--max-new", args.max_new, "--m", args.m,
                "--sessions", args.batches, "--threads", args.threads, "--device", args.device, "--out", str(args.out),
                *rest])


if __name__ == "__main__":
    sys.exit(main())
