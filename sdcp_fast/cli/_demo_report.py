"""The demo's report, the same in process and across processes: each session's text and
figures, the speculative run's summary, and the speedup over target-only decoding
(:mod:`sdcp_fast.benchlib.speedup` measures it) with the lines that explain it, and when the
measured costs eat the bound, what it would take to pay; then the speedup of each session
alone (B = 1), and both figures side by side.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

GOAL = 1.3  # the speedup a pass must leave room for, in the why line


def _print_comparison(base: dict[str, Any], tokens: int, where: str) -> None:
    print(f"\ntarget-only vs speculative{where}, {tokens} tokens each, {base['repeats']} interleaved pairs "
          f"(same roles, process, thread and device):")
    print(f"  {'pair':>4}  {'first':<12} {'speculative':>11}  {'target-only':>11}  {'speedup':>7}")
    for i, p in enumerate(base["pairs"], 1):
        print(f"  {i:>4}  {p['first']:<12} {p['speculative_s']:>9.2f} s  {p['target_only_s']:>9.2f} s  "
              f"{p['speedup']:>6.2f}x")
    same = base["identical_output"]
    print(f"speedup {base['speedup']}x (median of {base['repeats']}; range {base['speedup_min']}-"
          f"{base['speedup_max']}x)" + ("" if same is None else
          f"; output identical to target-only greedy decoding: {'yes' if all(same) else 'NO'}"))
    for line in why(base):
        print(f"  {line}")
    if base["spread_as_large_as_effect"]:
        lo, hi = base["speedup_min"], base["speedup_max"]
        sure = "its sign is not (every pair agrees)" if lo > 1 or hi < 1 else \
            "nor is its sign: the runs cannot tell speculation from noise"
        print(f"  the spread ({lo}-{hi}x) is as large as the effect: on this machine, under its present load, "
              f"the size of the speedup is not known; {sure}")


def _print_alone(alone: dict[str, Any], where: str) -> None:
    print(f"\neach session alone (B = 1: one session in flight){where}, {alone['repeats']} interleaved pairs of one "
          f"session each (same roles, process, thread and device):")
    print(f"  {'pair':>4}  {'session':<32} {'first':<12} {'tokens':>6}  {'speculative':>13}  {'target-only':>13}  "
          f"{'speedup':>7}")
    for i, p in enumerate(alone["pairs"], 1):
        print(f"  {i:>4}  {p['session'][:32]:<32} {p['first']:<12} {p['tokens']:>6}  "
              f"{p['speculative_tokens_per_s']:>7.1f} tok/s  {p['target_only_tokens_per_s']:>7.1f} tok/s  "
              f"{p['speedup']:>6.2f}x")
    rate = alone["tokens_per_s_per_session"]
    spec, base = rate["speculative"], rate["target_only"]
    same = alone["identical_output"]
    accept = "" if alone["acceptance"] is None else f", acceptance {alone['acceptance']:.0%}"
    print(f"per-session tokens/s: speculative {spec['median']} (range {spec['min']}-{spec['max']}), target-only "
          f"{base['median']} (range {base['min']}-{base['max']}){accept}")
    print(f"speedup at B = 1 {alone['speedup']}x (median of {alone['repeats']}; range {alone['speedup_min']}-"
          f"{alone['speedup_max']}x; the range covers the sessions' prompts as well as the load)" +
          ("" if same is None else f"; each pair's outputs identical: {'yes' if all(same) else 'NO'}"))


def _print_side_by_side(base: dict[str, Any] | None, alone: dict[str, Any] | None, sessions: int) -> None:
    figures = [(f"batched ({sessions} sessions decoded together)", base),
               ("each session alone (B = 1)", alone)]
    shown = [(name, f) for name, f in figures if f is not None]
    if len(shown) < 2:
        return
    print("\nspeedup over target-only decoding, median (range):")
    for name, f in shown:
        print(f"  {name:<40} {f['speedup']}x ({f['speedup_min']}-{f['speedup_max']}x)")


def why(base: dict[str, Any]) -> list[str]:
    """The lines that explain the speedup per session pass, and when speculation cannot pay
    here, what it would take."""
    ms, tpp = base["ms_per_session_pass"], base["tokens_per_session_pass"]
    accept = "" if base["acceptance"] is None else \
        f" (acceptance {base['acceptance']:.0%} at mean M {base['mean_m']})"
    whole = base["tokens_per_pass"]
    lines = [f"why, per session pass (one session scored once; a target pass scores several at once: "
             f"{whole['speculative']} tokens per pass speculative, {whole['target_only']} target-only):",
             f"  tokens per session pass: {tpp['speculative']} speculative{accept} vs {tpp['target_only']} "
             f"target-only; the session passes alone bound the speedup at {base['bound']}x",
             f"  time per session pass: {ms['speculative']:.2f} ms speculative "
             f"({base['ms_drafting_per_session_pass']:.2f} ms of it drafting) vs {ms['target_only']:.2f} ms "
             f"target-only, {base['pass_cost']}x the cost; the bound from the measured acceptance and costs: "
             f"{base['bound']}x / {base['pass_cost']} = {base['bound_from_costs']}x"]
    by_m = base.get("tokens_per_round_by_m")
    if by_m:
        per = ", ".join(f"M={m} {t}" for m, t in by_m.items())
        room = ", ".join(f"{t / GOAL:.2f}" for t in by_m.values())
        lines.append(f"  by M, were each draft token accepted independently at {base['acceptance']:.0%}: a round "
                     f"commits {per} tokens, so a round (its pass over M + 1 positions and the drafting) pays only "
                     f"below that many one-position passes, and {GOAL}x needs it below {room} "
                     f"(bench/cpu_pass.py measures a pass over M + 1 positions against one position)")
    if base["bound_from_costs"] < 1:
        lines.append(f"  speculation cannot pay here: a speculative session pass would have to cost at most "
                     f"{base['bound']}x a target-only one (it costs {base['pass_cost']}x), or commit at least "
                     f"{round(tpp['speculative'] * base['pass_cost'] / max(base['bound'], 1e-9), 2)} tokens per "
                     f"session pass at this cost (it commits {tpp['speculative']})")
    return lines


def report(out: dict[str, Any], args: argparse.Namespace, details: Sequence[str], summary: str, *,
           where: str = "", problem: str | None = None) -> int:
    """Print the demo's result, as one JSON object with ``--json``, else each session's text
    with its ``details``, the ``summary`` line and the comparison (run ``where``); the exit
    status is 1 when there is a ``problem`` or rule 1's output differs from the baseline's."""
    base, alone = out["baseline"], out.get("alone")
    same = None if base is None else base["identical_output"]
    if problem is None and same is not None and not all(same):
        problem = "the output differs from target-only greedy decoding"
    if problem is None and alone is not None and alone["identical_output"] is not None \
            and not all(alone["identical_output"]):
        problem = "a session decoded alone differs from its target-only greedy decoding"
    if args.json:
        print(json.dumps(out))
        return 0 if problem is None else 1
    print()
    for i, (session, detail) in enumerate(zip(out["sessions"], details, strict=True)):
        print(f"session {i}: {session['prompt']!r}\n  {session['text'].strip()!r}\n  {detail}")
    print(f"\n{summary}")
    if base is not None:
        _print_comparison(base, out["tokens"], where)
    if alone is not None:
        _print_alone(alone, where)
    _print_side_by_side(base, alone, len(out["sessions"]))
    if problem is not None:
        print(f"sdcp-fast demo: {problem}", file=sys.stderr)
    return 0 if problem is None else 1
