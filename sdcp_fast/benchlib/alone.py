"""Each session alone (B = 1): every in-process drafter configuration against target-only
decoding, one session in flight, the two sides' runs of each prompt interleaved as
:mod:`~sdcp_fast.benchlib.speedup` pairs them.

The concurrency levels of a run measure every configuration's repeats one after another, so
a load that changes between configurations lands on one side only; here each pair is one
prompt decoded by itself on each side, back to back, the order swapped from one pair to the
next. Each run is an in-process deployment of its own (as the demo's runs are), started
after the levels have warmed the target and drafters.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from sdcp_fast.benchlib.drive_local import run_inprocess
from sdcp_fast.benchlib.samples import Config, RunSample
from sdcp_fast.benchlib.speedup import Timed, each_alone, interleaved
from sdcp_fast.benchlib.workload import Workload


def timed(run: RunSample) -> Timed:
    """A measured run as one side of a pair."""
    drafted = [r for r in run.rounds if r.drafter is not None]
    return Timed(sum(s.tokens for s in run.samples), run.wall, len(run.passes),
                 sum(r.proposed for r in drafted), sum(r.accepted for r in drafted), len(drafted),
                 session_passes=len(run.rounds), draft_seconds=run.phases.get("draft", 0.0))


def measure(target: Any, drafter: tuple[Any, bytes], config: Config, baseline: Config, workload: Workload,
            repeats: int, *, backend: str = "auto", timeout: float = 600.0,
            on_session: Callable[[], None] | None = None) -> dict[str, Any]:
    """``repeats`` pairs per prompt of ``workload``: the prompt alone under ``config`` and
    under ``baseline`` (target-only); :func:`~sdcp_fast.benchlib.speedup.each_alone`'s
    figures, each pair's outputs compared under rule 1 (a session the escalation ladder
    failed is the same when its output is a prefix of target-only's)."""
    prompts = workload.prompts
    outs: dict[tuple[str, int], RunSample] = {}

    def side(name: str, cfg: Config, d: tuple[Any, bytes] | None) -> Callable[[int], Timed]:
        def run(k: int) -> Timed:
            one = replace(workload, prompts=(prompts[k % len(prompts)],))
            [sample] = run_inprocess(target, d, cfg, one, 1, 1, warmup=False, backend=backend, timeout=timeout)
            outs[name, k] = sample
            if on_session is not None:
                on_session()
            return timed(sample)
        return run

    pairs = interleaved(side("s", config, drafter), side("b", baseline, None), len(prompts) * max(1, repeats))
    identical = None
    if workload.rule == 1:
        identical = []
        for k in range(len(pairs)):
            [s], [b] = outs["s", k].samples, outs["b", k].samples
            out, ref = list(s.output or []), list(b.output or [])
            identical.append(out == ref or (s.finish == "fail" and ref[:len(out)] == out))
    return each_alone(pairs, [f"{p.index}:{p.kind}" for p in (prompts[k % len(prompts)] for k in range(len(pairs)))],
                      identical)
