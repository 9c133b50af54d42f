"""Decoding sessions' inter-token latency while a long prompt is prefilled, chunked or in
one pass (docs/roles.md, "Chunked prefill").

The roles run in one process on the in-process transport (router, verifier, the embedded
MLC), target-only: the verifier decodes every session itself, one token per round, so a
session's inter-token latency is the time between two of its committed rounds. Per
``--chunks`` value, one deployment: ``--sessions`` sessions with short prompts decode; after
``--warmup`` tokens each, their latencies are recorded for ``--tokens`` tokens each (the
baseline); then a ``--prompt``-token prompt arrives and their latencies are recorded again
until the long session's first token (its prefill). Both windows are measured in the same run
the same way; the ratio is p99 with the long prompt over p99 without it. With ``--sessions 0``
the long prompt arrives alone (every pass of its prefill takes the verifier's ``--solo``
budget, not the chunk): only its first token's time is measured.

    .venv/bin/python bench/prefill.py --chunks 32 512 0          # tiny-target, the CPU figure
    .venv/bin/python bench/prefill.py --sessions 0 --chunks 32 0  # the long prompt alone
    .venv/bin/python bench/prefill.py --model smollm2 --chunks 32 512 0

The default model is the shipped tiny target (4 layers, dim 256): on a 2-core CPU, SmolLM2-135M
(the embedded deployment's target) needs seconds per decoding pass and the 4,000-token prompt
takes hundreds of them in chunks of 32, which makes a run of it last an hour.

Prints one line per window and a line per chunk size; ``--json FILE`` writes them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch


def _percentiles(gaps: list[float]) -> dict[str, float]:
    """p50 and p99 in milliseconds (nearest rank), and how many gaps."""
    if not gaps:
        return {"n": 0, "p50_ms": 0.0, "p99_ms": 0.0}
    s = sorted(gaps)

    def rank(q: float) -> float:
        return 1000 * s[min(len(s) - 1, max(0, round(q * len(s) + 0.5) - 1))]

    return {"n": len(s), "p50_ms": rank(0.50), "p99_ms": rank(0.99)}


async def one_run(model: Any, *, chunk: int, solo: int | None, sessions: int, short: int, prompt: int, warmup: int, tokens: int,
                  root: str) -> dict[str, Any]:
    from sdcp_fast.deploy.local import Engine, session_id_for, spec_for
    from sdcp_fast.model.contract_digests import model_digest
    from sdcp_fast.model.target_scorer import ModelRunner
    from sdcp_fast.roles.verifier import RoundInfo
    from sdcp_fast.store import embedded

    vocab = model.cfg.vocab_size
    gen = torch.Generator().manual_seed(7)
    prompts = [torch.randint(0, vocab, (short,), generator=gen).tolist() for _ in range(sessions)]
    long_prompt = torch.randint(0, vocab, (prompt,), generator=gen).tolist()
    ids = [session_id_for(chunk + 1, i) for i in range(sessions + 1)]
    decoding, long_id = set(ids[:sessions]), ids[sessions]
    last: dict[bytes, float] = {}
    counts = dict.fromkeys(decoding, 0)
    gaps: list[tuple[float, float]] = []  # (end, seconds per token) of the decoding sessions
    baseline_start = asyncio.Event()
    baseline_done = asyncio.Event()
    first_token = asyncio.Event()
    marks: dict[str, float] = {}

    def on_round(info: RoundInfo) -> None:
        now = time.perf_counter()
        if info.session == long_id:
            marks.setdefault("first_token", now)
            first_token.set()
            return
        if info.session not in decoding:
            return
        if info.session in last and info.emitted:
            gaps.append((now, (now - last[info.session]) / len(info.emitted)))
        last[info.session] = now
        counts[info.session] += len(info.emitted)
        low = min(counts.values())
        if low >= warmup and not baseline_start.is_set():
            marks["baseline"] = now
            baseline_start.set()
        if low >= warmup + tokens:
            baseline_done.set()

    mlc = embedded(root)
    # The cache sized up front: growing it (a copy) inside a measured window would be a spike of its own.
    decoded = warmup + tokens + 2 * (prompt // max(chunk, 1) + 1) + 64
    runner = ModelRunner(model, num_blocks=(prompt + sessions * (short + decoded)) // 16 + sessions + 8)
    engine = Engine(runner, [], mlc, target_digest=model_digest("bench/prefill target"),
                    tokenizer_digest=model_digest("bench/prefill tokenizer"), prefill_chunk=chunk,
                    prefill_solo=solo)
    try:
        async with engine.deployment(on_round) as deployment:
            # Enough tokens that the decoding sessions outlast the long prefill; the run ends earlier.
            for i, p in enumerate(prompts):
                await deployment.router.open(replace(spec_for(p, max_new=4096), session=ids[i]))
            if sessions:
                await baseline_start.wait()
                await baseline_done.wait()
            marks["open"] = time.perf_counter()
            marks.setdefault("baseline", marks["open"])  # alone: no baseline window
            await deployment.router.open(replace(spec_for(long_prompt, max_new=2), session=long_id))
            await first_token.wait()
            passes = deployment.verifier.target_passes
    finally:
        mlc.close()
    without = [g for end, g in gaps if marks["baseline"] < end <= marks["open"]]
    with_long = [g for end, g in gaps if marks["open"] < end <= marks["first_token"]]
    a, b = _percentiles(without), _percentiles(with_long)
    return {"chunk": chunk, "without": a, "with": b, "p99_ratio": b["p99_ms"] / a["p99_ms"] if a["p99_ms"] else 0.0,
            "ttft_s": marks["first_token"] - marks["open"], "passes": passes}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tiny-target", help="tiny-target, smollm2 (the embedded deployment's), or "
                                                          "a GGUF / HF directory")
    p.add_argument("--chunks", type=int, nargs="+", default=[32, 0],
                   help="the verifier's --prefill-chunk of each run (0: the prompt in one pass)")
    p.add_argument("--solo", type=int, help="the verifier's --prefill-solo: a pass's budget with no decoding "
                                              "round in it (default: the verifier's for the device)")
    p.add_argument("--sessions", type=int, default=4, help="decoding sessions (0: the long prompt alone)")
    p.add_argument("--short", type=int, default=32, help="their prompts' tokens")
    p.add_argument("--prompt", type=int, default=4000, help="the long prompt's tokens")
    p.add_argument("--warmup", type=int, default=8, help="tokens each decoding session makes before the baseline")
    p.add_argument("--tokens", type=int, default=40, help="tokens of each decoding session in the baseline")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--device", default="cpu")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    from sdcp_fast.model import loader

    t = time.perf_counter()
    model = loader.load(args.model).model.to(args.device)
    print(f"{args.model}: loaded in {time.perf_counter() - t:.1f} s; {args.sessions} sessions decoding, a "
          f"{args.prompt}-token prompt arriving; {args.device}, {args.threads} threads", flush=True)
    runs = []
    for chunk in args.chunks:
        with tempfile.TemporaryDirectory(prefix="bench-prefill-") as root:
            run = asyncio.run(one_run(model, chunk=chunk, solo=args.solo, sessions=args.sessions, short=args.short,
                                      prompt=args.prompt, warmup=args.warmup, tokens=args.tokens, root=root))
        runs.append(run)
        name = f"chunk {chunk}" if chunk else "one pass"
        for window in ("without", "with") if args.sessions else ():
            w = run[window]
            print(f"  {name:<10} {window:<7} long prompt: itl p50 {w['p50_ms']:8.1f} ms  p99 {w['p99_ms']:8.1f} ms"
                  f"  ({w['n']} gaps)", flush=True)
        ratio = f"p99 with / without: {run['p99_ratio']:.2f}x" if args.sessions else "alone"
        print(f"  {name:<10} {ratio}; the long prompt's first token after "
              f"{run['ttft_s']:.2f} s; {run['passes']} passes in all", flush=True)
    if args.json:
        args.json.write_text(json.dumps({"args": vars(args) | {"json": str(args.json)}, "runs": runs,
                                         "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
