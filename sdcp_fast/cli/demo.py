"""``sdcp-fast demo``: the embedded default, end to end in one process.

Sessions are opened by the router, drafted, verified by the protocol core with the kernel
library, committed to a fenced file commit log in the embedded MLC, and escalated when
their drafter keeps being rejected. Prints each round, the text, and the figures.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time

HELP = "run SDCP sessions in-process on the embedded default and print text, rounds and figures"

PROMPTS = (
    "the verifier commits",
    "a drafter proposes tokens",
    "every session is",
    "the router",
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="toy", help="target model: 'toy' (built in, no checkpoint)")
    p.add_argument("--sessions", type=int, default=3, help="concurrent sessions (default 3)")
    p.add_argument("--max-new", type=int, default=32, help="tokens to generate per session (default 32)")
    p.add_argument("--rule", type=int, choices=(1, 2), default=None,
                   help="acceptance rule for all sessions (default: mixed, to show both)")
    p.add_argument("--seed", type=int, default=1, help="verifier seed for rule 2 (default 1)")
    p.add_argument("--backend", default="auto", help="kernel backend: auto, reference, cpu, triton")
    p.add_argument("--quiet", action="store_true", help="no per-round lines")
    p.add_argument("--json", action="store_true", help="print one JSON object with the results instead")


def run(args: argparse.Namespace) -> int:
    from sdcp_fast.cache import embedded
    from sdcp_fast.engine.inprocess import Engine, RoundRecord, SessionSpec, model_digest
    from sdcp_fast.engine.toy import ToyDrafter, ToyTarget, decode, encode
    from sdcp_fast.protocol import Action, Sampling

    if args.model != "toy":
        print(f"sdcp-fast demo: unknown model {args.model!r} (available: toy)", file=sys.stderr)
        return 2
    target = ToyTarget()
    drafters = [ToyDrafter("toy-good", target, 0.8), ToyDrafter("toy-weak", target, 6.0, seed=3)]
    specs = []
    for i in range(args.sessions):
        rule = args.rule or (1 if i % 2 == 0 else 2)
        specs.append(SessionSpec(
            prompt=encode(PROMPTS[i % len(PROMPTS)]), max_new=args.max_new, rule=rule,
            sampling=Sampling(temperature_milli=800, seed=args.seed + i) if rule == 2 else None,
            # The last session may only use the weak drafter: it walks the escalation ladder.
            drafters=("toy-weak",) if i == args.sessions - 1 and args.sessions > 1 else None,
        ))
    quiet = args.quiet or args.json

    def show(rec: RoundRecord) -> None:
        if quiet:
            return
        who = rec.drafter or "verifier (self-decode)"
        extra = "" if rec.action is Action.CONTINUE else f"  -> {rec.action.name.lower()}"
        print(f"  s{rec.session} r{rec.round:<3} {who:<23} M={rec.proposed} a={rec.accepted} "
              f"+{decode(rec.emitted)!r:<34} m_cap={rec.m_cap} d={rec.digest.hex()[:12]}{extra}")

    with tempfile.TemporaryDirectory(prefix="sdcp-demo-") as root:
        mlc = embedded(root)
        engine = Engine(target, drafters, mlc, target_digest=model_digest("toy-target"),
                        tokenizer_digest=model_digest("toy-words"), backend=args.backend, on_round=show)
        if not quiet:
            print(f"sdcp-fast demo: {len(specs)} sessions, toy target ({target.vocab_size} words), "
                  f"drafters {', '.join(d.name for d in drafters)}; MLC and commit logs in {root}")
        t0 = time.perf_counter()
        results = engine.run(specs)
        seconds = time.perf_counter() - t0
        passes = engine.target_passes
        stats = mlc.stats()
        mlc.close()

    total = sum(len(r.tokens) for r in results)
    report = {
        "sessions": [
            {"prompt": decode(r.prompt), "text": decode(r.tokens), "tokens": r.tokens,
             "finish": r.finish.name.lower() if r.finish is not None else None, "rounds": r.rounds,
             "acceptance": round(r.acceptance, 3), "self_decoded": r.self_decoded,
             "digest": r.digest.hex(), "chain_ok": r.chain_ok, "problems": r.problems}
            for r in results
        ],
        "tokens": total, "seconds": round(seconds, 3), "tokens_per_s": round(total / seconds, 1),
        "target_passes": passes, "tokens_per_pass": round(total / max(1, passes), 2),
        "mlc": stats,
    }
    if args.json:
        print(json.dumps(report, default=str))
        return 0 if all(r.chain_ok for r in results) else 1
    print()
    for i, (spec, r) in enumerate(zip(specs, results, strict=True)):
        print(f"session {i} (rule {spec.rule}): {decode(r.prompt)} | {decode(r.tokens)}")
        print(f"  {len(r.tokens)} tokens in {r.rounds} rounds, acceptance {r.acceptance:.0%}, "
              f"self-decoded {r.self_decoded}, finish {report['sessions'][i]['finish']}, "
              f"digest chain {'verified' if r.chain_ok else 'MISMATCH'} (d[n]={r.digest.hex()[:16]}...)")
    print(f"\n{total} tokens in {seconds:.2f}s ({report['tokens_per_s']} tokens/s); "
          f"{passes} target passes, {report['tokens_per_pass']} tokens per pass "
          f"(target-only decoding: 1 per pass)")
    return 0 if all(r.chain_ok for r in results) else 1
