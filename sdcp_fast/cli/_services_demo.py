"""The demo across processes: ``sdcp-fast up`` (MLC, router, two verifiers, two drafters, each
its own process, HTTP/2 + TLS 1.3 with client certificates), prompts sent through the
router's OpenAI-compatible front end and streamed back, the deployment's own counters
(``GET metrics`` of each verifier). The speedup is measured like for like, both sides in this
process through the same roles (benchlib/speedup.py), not against the deployment's run."""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


async def _stream(client: Any, base: str, index: int, body: dict[str, Any], show: bool,
                  chunks: list[str]) -> tuple[str, str | None, int]:
    response = await client.request_stream(base, "POST", "v1/completions", body=json.dumps(body).encode(),
                                           headers={"content-type": "application/json"}, timeout=60)
    if response.status != 200:
        raise RuntimeError(f"front end answered {response.status}: {response.body[:300]!r}")
    from sdcp_fast.roles.sse import DONE, messages

    text, finish, tokens = "", None, 0
    assert response.stream is not None
    async for message in messages(response.stream):
        if message == DONE:
            continue
        if message.get("usage"):
            tokens = message["usage"]["completion_tokens"]
        for choice in message.get("choices", ()):
            piece = choice.get("text", "")
            text += piece
            finish = choice.get("finish_reason") or finish
            if piece:
                chunks.append(piece)
                if show:
                    print(f"  s{index} +{piece!r}", flush=True)
    return text, finish, tokens


async def _drive(up: Any, texts: list[str], args: argparse.Namespace, show: bool) -> dict[str, Any]:
    from sdcp_fast.benchlib.drive_network import parse_metrics
    from sdcp_fast.transport.h2client import H2Transport
    from sdcp_fast.transport.tls import client_context

    e = up.endpoints()
    client = H2Transport(client_context(e["client_cert"], e["client_key"], e["ca"]))
    base = up.services["router"].uri
    try:
        bodies = []
        for i, text in enumerate(texts):
            body: dict[str, Any] = {"model": up.model, "prompt": text, "max_tokens": args.max_new, "stream": True,
                                    "stream_options": {"include_usage": True}}
            if args.rule == 2:
                body.update(temperature=args.temperature, seed=args.seed + i)
            bodies.append(body)
        chunks: list[str] = []
        t0 = time.perf_counter()
        results = await asyncio.gather(*(_stream(client, base, i, b, show, chunks) for i, b in enumerate(bodies)))
        seconds = time.perf_counter() - t0
        counters: dict[str, float] = {}
        for name in ("verifier", "verifier-standby"):
            response = await client.request(up.services[name].uri, "GET", "metrics")
            for key, value in parse_metrics(response.body.decode()).items():
                counters[key] = counters.get(key, 0.0) + value
        return {"results": results, "seconds": seconds, "counters": counters, "chunks": len(chunks)}
    finally:
        await client.close()


def run_services(args: argparse.Namespace, model: str, setup: Any, compare: Callable[..., dict[str, Any]],
                 compare_alone: Callable[..., dict[str, Any] | None]) -> int:
    """``compare(setup, args, lengths, same)``: the demo's like-for-like speedup, batched;
    ``compare_alone(setup, args, lengths)``: each session alone (B = 1)."""
    texts = setup.texts
    from sdcp_fast.cli._demo_report import report as demo_report
    from sdcp_fast.deploy.up import Up

    quiet = args.quiet or args.json
    drafters = tuple(d.name for d in setup.drafters) if setup.drafters else None
    with tempfile.TemporaryDirectory(prefix="sdcp-demo-") as root:
        up = Up(Path(root), model=model, drafters=drafters, device=None if args.device == "cpu" else args.device,
                weights=args.weights)
        if not quiet:
            print("sdcp-fast demo: starting the deployment (sdcp-fast up: MLC, router, 2 verifiers, 2 drafters, "
                  "HTTP/2 + mutual TLS on loopback) ...", flush=True)
        try:
            t0 = time.perf_counter()
            up.start()
            if not quiet:
                for name, svc in up.services.items():
                    print(f"  {name:<17} {svc.uri}", flush=True)
                print(f"  all healthy in {time.perf_counter() - t0:.1f}s; {len(texts)} sessions through the front "
                      f"end {up.services['router'].uri}v1/completions (streamed)", flush=True)
            from sdcp_fast.transport.loop import run as run_loop

            report = run_loop(_drive(up, texts, args, show=not quiet))
        finally:
            up.stop()
    lengths = [n for _, _, n in report["results"]]  # completion_tokens of each stream's usage
    total = sum(lengths)
    c = report["counters"]
    proposed, accepted = c.get("sdcp_proposed_tokens_total", 0.0), c.get("sdcp_accepted_tokens_total", 0.0)
    passes = c.get("sdcp_batch_size_count", 0.0)
    escalations = {k.split('"')[1]: int(v) for k, v in c.items() if k.startswith("sdcp_escalations_total{")}
    seconds = report["seconds"]
    baseline = alone = None
    if not args.no_baseline:
        if not quiet:
            print(f"speculative and target-only decoding of the same prompts, in process (like for like), "
                  f"{args.repeats} interleaved pairs ...", flush=True)

        def same(outs: list[list[int]]) -> list[bool]:
            # The front end streams text without the stop token (it ends the stream): compare likewise.
            return [setup.decode([x for x in o if x not in setup.stop]).split() == t.split()
                    for o, (t, _, _) in zip(outs, report["results"], strict=True)]

        baseline = compare(setup, args, lengths, same)
        if args.alone > 0 and not quiet:
            print(f"each session alone (B = 1), in process, {args.alone} interleaved pair(s) per session ...",
                  flush=True)
        alone = compare_alone(setup, args, lengths)
    out = {
        "mode": "services", "model": model,
        "sessions": [{"prompt": label, "text": t, "finish": f, "tokens": n}
                     for label, (t, f, n) in zip(setup.labels, report["results"], strict=True)],
        "tokens": total, "seconds": round(seconds, 3), "tokens_per_s": round(total / max(seconds, 1e-9), 1),
        "acceptance": round(accepted / proposed, 3) if proposed else None,
        "rounds": int(c.get("sdcp_rounds_total", 0)), "self_decoded_rounds": int(c.get("sdcp_self_decoded_rounds_total", 0)),
        "target_passes": int(passes), "tokens_per_pass": round(total / passes, 2) if passes else None,
        "escalations": escalations, "baseline": baseline, "alone": alone,
    }
    details = [f"{s['tokens']} tokens, finish {s['finish']}" for s in out["sessions"]]
    summary = (f"speculative, across processes: {total} tokens in {seconds:.2f}s ({out['tokens_per_s']} tokens/s), "
               f"{out['rounds']} rounds in {out['target_passes']} target passes ({out['tokens_per_pass']} tokens per "
               f"pass), acceptance {out['acceptance']}, escalations {escalations or 'none'}")
    return demo_report(out, args, details, summary, where=" (in process)")
