"""The demo's report, the same in process and across processes: each session's text and
figures, the speculative run's summary, and the speedup over target-only decoding.

The speedup is measured like for like (the same roles, process, thread and device for both)
and more than once: speculative and target-only runs alternate in pairs, the order swapped
from one pair to the next, so a load that rises or falls during the run lands on both sides.
The report gives the median speedup with its range, says when the range is as wide as the
effect, and shows why, per session: a session is scored once per round, alone or in a pass
shared with other sessions, so the figures that explain the speedup are counted per session
pass (one session's part of a target pass), not per pass over all sessions. Target-only
decoding commits one token per session pass; speculative decoding commits 1 + the accepted
draft tokens. Their ratio is the bound the passes give (the speedup if a speculative session
pass cost what a target-only one does); the measured cost of a session pass on each side
(drafting included) turns it into the speedup, and when that cost eats the bound, the report
says what it would take to pay.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sdcp_fast.harness.figures import speedup_bound

BY_M = (1, 2, 3, 4)  # the draft lengths the why line's bound is given for
GOAL = 1.3  # the speedup a pass must leave room for, in the why line

@dataclass(frozen=True)
class Timed:
    """One run of the demo's sessions."""

    tokens: int
    seconds: float
    passes: int  # target scoring passes (a pass scores every session in its batch)
    proposed: int = 0  # draft tokens proposed in drafter rounds (0: target-only)
    accepted: int = 0
    rounds: int = 0  # drafter rounds
    session_passes: int = 0  # committed rounds of all sessions: one session scored once each (0: use passes)
    draft_seconds: float = 0.0  # in the drafters' propose

    @property
    def per_session(self) -> int:
        return self.session_passes or self.passes


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
    """The figures of the pairs: the speedup (median, range); per session pass, each side's
    tokens and time (and the speculative side's drafting time), the bound the session passes
    give (the speedup if a speculative session pass cost what a target-only one does), the cost
    ratio of a session pass, and the bound from both (what the measured acceptance and costs
    allow); each side's tokens per whole pass (batching); and (rule 1) whether each session's
    output is the same."""
    speedups = [b.seconds / max(s.seconds, 1e-9) for s, b in pairs]
    median = statistics.median(speedups)
    lo, hi = min(speedups), max(speedups)
    sides = (("speculative", [s for s, _ in pairs]), ("target_only", [b for _, b in pairs]))
    ms = {side: statistics.median(r.seconds / max(r.passes, 1) * 1e3 for r in runs) for side, runs in sides}
    ms_session = {side: statistics.median(r.seconds / max(r.per_session, 1) * 1e3 for r in runs)
                  for side, runs in sides}
    ms_draft = statistics.median(s.draft_seconds / max(s.per_session, 1) * 1e3 for s, _ in pairs)
    bound = statistics.median(b.per_session / max(s.per_session, 1) for s, b in pairs)
    cost = ms_session["speculative"] / max(ms_session["target_only"], 1e-9)
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
        "ms_per_session_pass": {k: round(v, 3) for k, v in ms_session.items()},
        "ms_drafting_per_session_pass": round(ms_draft, 3),
        "tokens_per_session_pass": {"speculative": round(tokens / max(pairs[0][0].per_session, 1), 2),
                                    "target_only": round(tokens / max(pairs[0][1].per_session, 1), 2)},
        "bound": round(bound, 2),
        "pass_cost": round(cost, 2),
        "bound_from_costs": round(bound / max(cost, 1e-9), 2),
        "acceptance": round(sum(s.accepted for s, _ in pairs) / proposed, 3) if proposed else None,
        "tokens_per_round_by_m": ({m: round(speedup_bound(sum(s.accepted for s, _ in pairs) / proposed, m,
                                                          0.0, 1.0, 1.0) or 0.0, 2) for m in BY_M}
                                  if proposed else None),
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
    for line in why(base):
        print(f"  {line}")
    if base["spread_as_large_as_effect"]:
        lo, hi = base["speedup_min"], base["speedup_max"]
        sure = "its sign is not (every pair agrees)" if lo > 1 or hi < 1 else \
            "nor is its sign: the runs cannot tell speculation from noise"
        print(f"  the spread ({lo}-{hi}x) is as large as the effect: on this machine, under its present load, "
              f"the size of the speedup is not known; {sure}")


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
