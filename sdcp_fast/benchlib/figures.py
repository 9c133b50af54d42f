"""From raw samples to the figures of the summary: throughput with its spread over repeats,
latency percentiles, acceptance, batching, the time per round by part, and the speedup over
target-only decoding (measured as :mod:`~sdcp_fast.benchlib.speedup` says) next to the bound the
measured acceptance and costs allow."""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Sequence
from typing import Any

from sdcp_fast.benchlib.samples import RunSample
from sdcp_fast.benchlib.speedup import from_rates, speedup_bound
from sdcp_fast.benchlib.speedup import spread as speedup_spread

PHASE_ORDER = ("draft", "mlc_write", "mlc_read", "scoring", "acceptance", "commit", "other",
               "verifier", "outside_verifier")


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not values:
        return None
    s = sorted(values)
    pos = (len(s) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def spread(values: Sequence[float]) -> dict[str, float | None]:
    return {"median": statistics.median(values) if values else None, "min": min(values, default=None),
            "max": max(values, default=None), "n": len(values)}


def pcts(values: Sequence[float]) -> dict[str, float | None]:
    return {f"p{q}": percentile(values, q) for q in (50, 90, 99)}


def itl(chunks: Sequence[tuple[float, int]]) -> list[float]:
    """Inter-token latency per later piece: the gap since the piece before, shared by the
    tokens of the piece (a round commits several tokens at once)."""
    return [(t - t0) / (n if n > 0 else 1) for (t0, _), (t, n) in zip(chunks, chunks[1:], strict=False)]


def summarize(runs: Sequence[RunSample]) -> dict[str, Any]:
    """The figures of one configuration at one concurrency level, over its repeats."""
    tps, per_session, ttft, lat, acc_hist = [], [], [], [], Counter[int]()
    sessions = failed = estimated = 0
    rounds = proposed = accepted = drafter_rounds = tokens = passes = 0
    escalations: Counter[str] = Counter()
    batches: Counter[int] = Counter()
    problems: Counter[str] = Counter()
    phases: Counter[str] = Counter()
    pass_seconds = drafted = wall = session_seconds = 0.0
    for run in runs:
        n = sum(s.tokens for s in run.samples)
        tokens += n
        wall += run.wall
        tps.append(n / run.wall if run.wall else 0.0)
        for s in run.samples:
            if s.finished is not None and s.tokens and s.finished > s.opened:
                per_session.append(s.tokens / (s.finished - s.opened))
            if s.first is not None:
                ttft.append(s.first - s.arrived)
                session_seconds += (s.finished or s.first) - s.opened
            lat += itl(s.chunks)
            problems.update(s.problems)
            sessions += 1
            failed += bool(s.problems)
            estimated += s.tokens_estimated
        problems.update(run.problems)
        for r in run.rounds:
            rounds += 1
            if r.drafter is not None:
                drafter_rounds += 1
                proposed += r.proposed
                accepted += r.accepted
                acc_hist[r.accepted] += 1
                if r.action not in ("continue", "finish"):
                    escalations[r.action] += 1
        batches.update(b for b, _ in run.passes)
        passes += len(run.passes)
        pass_seconds += sum(t for _, t in run.passes)
        drafted += run.drafted_tokens
        phases.update(run.phases)
        c = run.counters
        if c:  # a deployment's own counts (remote runs): rounds and acceptance from its metrics
            rounds += int(c.get("sdcp_rounds_total", 0))
            proposed += int(c.get("sdcp_proposed_tokens_total", 0))
            accepted += int(c.get("sdcp_accepted_tokens_total", 0))
            drafter_rounds += int(c.get("sdcp_rounds_total", 0) - c.get("sdcp_self_decoded_rounds_total", 0))
            passes += int(c.get("sdcp_batch_size_count", 0))
            for key, v in c.items():
                if key.startswith("sdcp_escalations_total{"):
                    escalations[key.split('"')[1]] += int(v)
                if key.startswith("sdcp_problems_total{") and v:
                    problems[key.split('"')[1]] += int(v)
    breakdown = None
    if "verifier" in phases and rounds:
        # Over the network only the verifiers' verdict latency is measured: a session's time
        # per committed round splits into waiting on verdicts and the rest (drafting, the
        # network, the router and front end, rounds the verifier decoded itself).
        breakdown = {"verifier": phases["verifier"] / rounds,
                     "outside_verifier": max(0.0, session_seconds - phases["verifier"]) / rounds}
    elif rounds and phases:
        # In process every part runs on one thread: what the parts do not account for is the
        # event loop, batching waits and the transport's direct calls.
        phases["other"] = max(0.0, wall - sum(phases.values()))
        breakdown = {k: phases[k] / rounds for k in PHASE_ORDER if k in phases}
    return {
        "repeats": len(runs), "tokens": tokens, "sessions": sessions, "sessions_failed": failed,
        "sessions_tokens_estimated": estimated,
        "tokens_per_s": spread(tps),
        "tokens_per_s_per_session": pcts(per_session) | {"median": statistics.median(per_session) if per_session else None},
        "ttft_s": pcts(ttft), "itl_s": pcts(lat),
        "acceptance": accepted / proposed if proposed else None,
        "accepted_per_round": accepted / drafter_rounds if drafter_rounds else None,
        "proposed_per_round": proposed / drafter_rounds if drafter_rounds else None,
        "acceptance_histogram": dict(sorted(acc_hist.items())),
        "rounds": rounds, "drafter_rounds": drafter_rounds, "target_passes": passes,
        "tokens_per_pass": tokens / passes if passes else None,
        "escalations": dict(escalations), "problems": dict(problems),
        "batch_sizes": dict(sorted(batches.items())) or _batch_buckets(runs),
        "mean_batch": _mean_batch(batches, runs),
        "t_pass_s": pass_seconds / passes if passes and pass_seconds else None,
        "t_draft_token_s": phases.get("draft", 0.0) / drafted if drafted else None,
        "breakdown_s_per_round": breakdown,
        "counters": _merge_counters(runs),
    }


def _mean_batch(batches: Counter[int], runs: Sequence[RunSample]) -> float | None:
    if batches:
        return sum(b * c for b, c in batches.items()) / sum(batches.values())
    total = sum(r.counters.get("sdcp_batch_size_sum", 0.0) for r in runs)
    count = sum(r.counters.get("sdcp_batch_size_count", 0.0) for r in runs)
    return total / count if count else None  # a deployment's histogram (remote runs)


def _batch_buckets(runs: Sequence[RunSample]) -> dict[str, float]:
    """Passes by batch size from a deployment's histogram (remote runs): ``"<=4"`` counts the
    passes of 3 or 4 sessions when the bucket below is 2 (the histogram's resolution)."""
    cumulative: Counter[float] = Counter()
    for run in runs:
        for key, v in run.counters.items():
            if key.startswith("sdcp_batch_size_bucket{") and 'le="+Inf"' not in key:
                cumulative[float(key.split('le="')[1].split('"')[0])] += v
    out, below = {}, 0.0
    for le in sorted(cumulative):
        if cumulative[le] - below:
            out[f"<={le:g}"] = cumulative[le] - below
        below = cumulative[le]
    return out


def _merge_counters(runs: Sequence[RunSample]) -> dict[str, float]:
    out: Counter[str] = Counter()
    for run in runs:
        out.update(run.counters)
    return dict(out)


def add_speedups(summary: dict[str, dict[int, dict[str, Any]]], baseline: str,
                 rates: dict[tuple[str, int], list[float]]) -> None:
    """Speedup over ``baseline`` at the same concurrency level, from ``rates`` (tokens/s of each
    repeat of a configuration and level, in the order run), and the bound from measured
    acceptance and costs (in-process configurations, where the costs are measured)."""
    for name, levels in summary.items():
        for level, fig in levels.items():
            base = summary.get(baseline, {}).get(level)
            ratios = from_rates(rates.get((name, level), []), rates.get((baseline, level), []))
            if base is None or not ratios:
                continue
            fig.update(speedup_spread(ratios))
            a, m = fig["acceptance"], fig["proposed_per_round"]
            if a is not None and m and fig["t_pass_s"] and base["t_pass_s"] and fig["t_draft_token_s"] is not None:
                fig["speedup_bound"] = speedup_bound(a, m, fig["t_draft_token_s"], fig["t_pass_s"], base["t_pass_s"],
                                                     fig["mean_batch"] or 1.0)
