"""The demo's report, the same in process and across processes: each session's text and
figures, the speculative run's summary, and the speedup over target-only decoding.

The speedup is measured like for like (the same roles, process, thread and device for both)
and more than once: speculative and target-only runs alternate in pairs, the order swapped
from one pair to the next, so a load that rises or falls during the run lands on both sides.
The report gives the median speedup with its range, says when the range is as wide as the
effect, and shows why: each run's time per target pass, and the bound its passes give.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Timed:
    """One run of the demo's sessions."""

    tokens: int
    seconds: float
    passes: int  # target scoring passes (a pass scores every session in its batch)
    proposed: int = 0  # draft tokens proposed in drafter rounds (0: target-only)
    accepted: int = 0
    rounds: int = 0  # drafter rounds


def interleaved(speculative: Callable[[int], Timed], target_only: Callable[[int], Timed],
                repeats: int) -> list[tuple[Timed, Timed]]:
    """``repeats`` (speculative, target-only) pairs; pair i runs speculative first when i is
    even, target-only first when odd."""
    pairs = []
    for i in range(max(1, repeats)):
        if i % 2 == 0:
            s = speculative(i)
            b = target_only(i)
        else:
            b = target_only(i)
            s = speculative(i)
        pairs.append((s, b))
    return pairs


def comparison(pairs: Sequence[tuple[Timed, Timed]], identical: list[bool] | None) -> dict[str, Any]:
    """The figures of the pairs: the speedup (median, range), each side's time per target pass
    and tokens per pass, the bound the passes give (the speedup if a speculative pass cost what
    a target-only one does), and (rule 1) whether each session's output is the same."""
    speedups = [b.seconds / max(s.seconds, 1e-9) for s, b in pairs]
    median = statistics.median(speedups)
    lo, hi = min(speedups), max(speedups)
    ms = {side: statistics.median(r.seconds / max(r.passes, 1) * 1e3 for r in runs)
          for side, runs in (("speculative", [s for s, _ in pairs]), ("target_only", [b for _, b in pairs]))}
    proposed = sum(s.proposed for s, _ in pairs)
    base_seconds = statistics.median(b.seconds for _, b in pairs)
    tokens = pairs[0][1].tokens
    return {
        "seconds": round(base_seconds, 3), "tokens_per_s": round(tokens / max(base_seconds, 1e-9), 1),
        "speedup": round(median, 2), "speedup_min": round(lo, 2), "speedup_max": round(hi, 2),
        "repeats": len(pairs),
        # The range reaches from no gain past the gain itself: the machine's load, not
        # speculation, decides the figure.
        "spread_as_large_as_effect": hi - lo >= abs(median - 1.0),
        "ms_per_pass": {k: round(v, 3) for k, v in ms.items()},
        "tokens_per_pass": {"speculative": round(tokens / max(pairs[0][0].passes, 1), 2),
                            "target_only": round(tokens / max(pairs[0][1].passes, 1), 2)},
        "bound": round(statistics.median(b.passes / max(s.passes, 1) for s, b in pairs), 2),
        "pass_cost": round(ms["speculative"] / max(ms["target_only"], 1e-9), 2),
        "acceptance": round(sum(s.accepted for s, _ in pairs) / proposed, 3) if proposed else None,
        "mean_m": round(proposed / max(1, sum(s.rounds for s, _ in pairs)), 2) if proposed else None,
        "pairs": [{"speculative_s": round(s.seconds, 3), "target_only_s": round(b.seconds, 3),
                   "first": "speculative" if i % 2 == 0 else "target-only", "speedup": round(x, 2)}
                  for i, ((s, b), x) in enumerate(zip(pairs, speedups, strict=True))],
        "identical_output": identical,
    }


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
    ms, tpp = base["ms_per_pass"], base["tokens_per_pass"]
    accept = "" if base["acceptance"] is None else \
        f" (acceptance {base['acceptance']:.0%} at mean M {base['mean_m']})"
    print(f"  why: a target pass takes {ms['speculative']:.2f} ms speculative ({tpp['speculative']} tokens/pass) "
          f"vs {ms['target_only']:.2f} ms target-only ({tpp['target_only']} tokens/pass): {base['bound']}x fewer "
          f"passes{accept}, each {base['pass_cost']}x the cost; the passes alone bound the speedup at "
          f"{base['bound']}x")
    if base["spread_as_large_as_effect"]:
        lo, hi = base["speedup_min"], base["speedup_max"]
        sure = "its sign is not (every pair agrees)" if lo > 1 or hi < 1 else \
            "nor is its sign: the runs cannot tell speculation from noise"
        print(f"  the spread ({lo}-{hi}x) is as large as the effect: on this machine, under its present load, "
              f"the size of the speedup is not known; {sure}")


def report(out: dict[str, Any], args: argparse.Namespace, details: Sequence[str], summary: str, *,
           where: str = "", problem: str | None = None) -> int:
    """Print the demo's result, as one JSON object with ``--json``, else each session's text
    with its ``details``, the ``summary`` line and the comparison (run ``where``); the exit
    status is 1 when there is a ``problem`` or rule 1's output differs from the baseline's."""
    base = out["baseline"]
    same = None if base is None else base["identical_output"]
    if problem is None and same is not None and not all(same):
        problem = "the output differs from target-only greedy decoding"
    if args.json:
        print(json.dumps(out))
        return 0 if problem is None else 1
    print()
    for i, (session, detail) in enumerate(zip(out["sessions"], details, strict=True)):
        print(f"session {i}: {session['prompt']!r}\n  {session['text'].strip()!r}\n  {detail}")
    print(f"\n{summary}")
    if base is not None:
        _print_comparison(base, out["tokens"], where)
    if problem is not None:
        print(f"sdcp-fast demo: {problem}", file=sys.stderr)
    return 0 if problem is None else 1
