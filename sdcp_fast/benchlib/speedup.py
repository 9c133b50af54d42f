"""The speedup over target-only decoding, measured one way wherever it is measured (``sdcp-fast
bench``, the demo, bench/cpu.py), and the bound the measured acceptance and costs allow.

Speculative and target-only runs of the same sessions, on the same roles, process, thread and
device, make pairs; the speedup is the median over the pairs of target-only time / speculative
time (the same tokens on both sides), with its range. Where the caller can, the pairs are
interleaved (:func:`interleaved`: the order swapped from one pair to the next), so a load that
rises or falls during the run lands on both sides; a bench run pairs each configuration's
repeat i with target-only's repeat i at the same concurrency level.

Batched, a pair is all sessions decoded together on each side (:func:`comparison`). Each
session alone (B = 1, :func:`each_alone`), a pair is one session decoded by itself on each
side: what a user of speculative decoding at low batch sees, since target-only decoding then
has no other sessions to share its passes with.

Figures that explain the speedup are counted per session pass (one session's part of a target
pass), not per pass over all sessions: a session is scored once per round, alone or in a pass
shared with other sessions. Target-only decoding commits one token per session pass;
speculative decoding commits 1 + the accepted draft tokens. Their ratio is the bound the passes
give (the speedup if a speculative session pass cost what a target-only one does); the measured
cost of a session pass on each side (drafting included) turns it into the speedup.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

BY_M = (1, 2, 3, 4)  # the draft lengths the tokens per round are given for

T = TypeVar("T")


def speedup_bound(a: float, m: float, t_draft: float, t_verify: float, t_pass: float, batch: float = 1.0) -> float | None:
    """Tokens per round per session, ``(1 - a^(M+1)) / (1 - a)``, over the round's cost in
    target-only passes: M draft steps for each of the ``batch`` sessions (one after another,
    as on one CPU) plus one verifying pass, against one target-only pass per token."""
    if t_pass <= 0 or m <= 0:
        return None
    per_round = m + 1 if a >= 1 else (1 - a ** (m + 1)) / (1 - a)
    return per_round / ((batch * m * t_draft + t_verify) / t_pass)


def acceptance_needed(goal: float, m: float, t_draft: float, t_verify: float, t_pass: float) -> float | None:
    """The smallest acceptance a with :func:`speedup_bound` at least ``goal`` (one session);
    None when even a = 1 (every draft token accepted) falls short. The bound grows with a."""
    def reach(a: float) -> float:
        return speedup_bound(a, m, t_draft, t_verify, t_pass) or 0.0

    if reach(1.0) < goal:
        return None
    if reach(0.0) >= goal:
        return 0.0
    lo, hi = 0.0, 1.0
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if reach(mid) >= goal else (mid, hi)
    return hi


@dataclass(frozen=True)
class Timed:
    """One run of the sessions, on one side of a pair."""

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


def combined(runs: Sequence[Timed]) -> Timed:
    """Runs one after another (each prompt alone, say) as one run."""
    return Timed(sum(r.tokens for r in runs), sum(r.seconds for r in runs), sum(r.passes for r in runs),
                 sum(r.proposed for r in runs), sum(r.accepted for r in runs), sum(r.rounds for r in runs),
                 sum(r.per_session for r in runs), sum(r.draft_seconds for r in runs))


def interleaved(speculative: Callable[[int], T], target_only: Callable[[int], T], repeats: int) -> list[tuple[T, T]]:
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


def speedups(pairs: Sequence[tuple[Timed, Timed]]) -> list[float]:
    """Each pair's speedup: target-only time / speculative time."""
    return [b.seconds / max(s.seconds, 1e-9) for s, b in pairs]


def from_rates(speculative: Sequence[float], target_only: Sequence[float]) -> list[float]:
    """Each pair's speedup from tokens/s of the same tokens on both sides (pair i: the i-th of
    each; a side with no rate pairs with nothing)."""
    return [s / b for s, b in zip(speculative, target_only, strict=False) if b > 0]


def spread(ratios: Sequence[float]) -> dict[str, Any]:
    """The speedup (median) with its range, and whether the range reaches from no gain past
    the gain itself: then the machine's load, not speculation, decides the figure."""
    median, lo, hi = statistics.median(ratios), min(ratios), max(ratios)
    return {"speedup": median, "speedup_min": lo, "speedup_max": hi,
            "spread_as_large_as_effect": hi - lo >= abs(median - 1.0)}


def _rates(runs: Sequence[Timed]) -> dict[str, float]:
    rates = [r.tokens / max(r.seconds, 1e-9) for r in runs]
    return {"median": round(statistics.median(rates), 1), "min": round(min(rates), 1), "max": round(max(rates), 1)}


def each_alone(pairs: Sequence[tuple[Timed, Timed]], sessions: Sequence[str],
               identical: list[bool] | None) -> dict[str, Any]:
    """The figures of pairs of one session each (B = 1; ``sessions[i]`` names pair i's): the
    speedup (median, range) and each side's per-session tokens/s (median, range), the
    acceptance, each pair, and (rule 1) whether each pair's outputs are the same. The range
    covers the sessions' prompts as well as the load."""
    ratios = speedups(pairs)
    figure = spread(ratios)
    proposed = sum(s.proposed for s, _ in pairs)
    return {
        "speedup": round(figure["speedup"], 2), "speedup_min": round(figure["speedup_min"], 2),
        "speedup_max": round(figure["speedup_max"], 2), "repeats": len(pairs),
        "spread_as_large_as_effect": figure["spread_as_large_as_effect"],
        "tokens_per_s_per_session": {"speculative": _rates([s for s, _ in pairs]),
                                     "target_only": _rates([b for _, b in pairs])},
        "acceptance": round(sum(s.accepted for s, _ in pairs) / proposed, 3) if proposed else None,
        "pairs": [{"session": name, "first": "speculative" if i % 2 == 0 else "target-only", "tokens": b.tokens,
                   "speculative_s": round(s.seconds, 3), "target_only_s": round(b.seconds, 3),
                   "speculative_tokens_per_s": round(s.tokens / max(s.seconds, 1e-9), 1),
                   "target_only_tokens_per_s": round(b.tokens / max(b.seconds, 1e-9), 1), "speedup": round(x, 2)}
                  for i, ((s, b), name, x) in enumerate(zip(pairs, sessions, ratios, strict=True))],
        "identical_output": identical,
    }


def comparison(pairs: Sequence[tuple[Timed, Timed]], identical: list[bool] | None) -> dict[str, Any]:
    """The figures of the pairs: the speedup (median, range); per session pass, each side's
    tokens and time (and the speculative side's drafting time), the bound the session passes
    give, the cost ratio of a session pass, and the bound from both (what the measured
    acceptance and costs allow); each side's tokens per whole pass (batching); and (rule 1)
    whether each session's output is the same."""
    ratios = speedups(pairs)
    figure = spread(ratios)
    sides = (("speculative", [s for s, _ in pairs]), ("target_only", [b for _, b in pairs]))
    ms = {side: statistics.median(r.seconds / max(r.passes, 1) * 1e3 for r in runs) for side, runs in sides}
    ms_session = {side: statistics.median(r.seconds / max(r.per_session, 1) * 1e3 for r in runs)
                  for side, runs in sides}
    ms_draft = statistics.median(s.draft_seconds / max(s.per_session, 1) * 1e3 for s, _ in pairs)
    bound = statistics.median(b.per_session / max(s.per_session, 1) for s, b in pairs)
    cost = ms_session["speculative"] / max(ms_session["target_only"], 1e-9)
    proposed = sum(s.proposed for s, _ in pairs)
    accepted = sum(s.accepted for s, _ in pairs)
    base_seconds = statistics.median(b.seconds for _, b in pairs)
    tokens = pairs[0][1].tokens
    return {
        "seconds": round(base_seconds, 3), "tokens_per_s": round(tokens / max(base_seconds, 1e-9), 1),
        "speedup": round(figure["speedup"], 2), "speedup_min": round(figure["speedup_min"], 2),
        "speedup_max": round(figure["speedup_max"], 2), "repeats": len(pairs),
        "spread_as_large_as_effect": figure["spread_as_large_as_effect"],
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
        "acceptance": round(accepted / proposed, 3) if proposed else None,
        "tokens_per_round_by_m": ({m: round(speedup_bound(accepted / proposed, m, 0.0, 1.0, 1.0) or 0.0, 2)
                                   for m in BY_M} if proposed else None),
        "mean_m": round(proposed / max(1, sum(s.rounds for s, _ in pairs)), 2) if proposed else None,
        "pairs": [{"speculative_s": round(s.seconds, 3), "target_only_s": round(b.seconds, 3),
                   "first": "speculative" if i % 2 == 0 else "target-only", "speedup": round(x, 2)}
                  for i, ((s, b), x) in enumerate(zip(pairs, ratios, strict=True))],
        "identical_output": identical,
    }
