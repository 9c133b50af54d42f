"""One bench run: the configurations, each at each concurrency level and repeated, with the
same prompts on the same machine; then the figures, report.json and the plots.

In process (``sdcp_fast.deploy.local``) a deployment can be started with anything, so
the comparison lives there: target-only decoding (no drafter: the verifier decodes every
session itself), each drafter with a fixed M, the first drafter with §6.2's adaptive M and
without cross-session batching (a verifier scoring one session per pass). Over the network a
deployment is what it was started with: ``--embedded`` starts ``sdcp-fast up`` with the
first drafter, the same fixed M and batch limit (and device), which sits next to the in-process
``<drafter>`` row to show what distribution costs; ``--router`` measures a running
deployment, whose target-only figure is measured in process when its model is here.
Then each session alone (B = 1): each drafter's fixed-M configuration against target-only,
one prompt at a time, the two sides interleaved (``benchlib/alone.py``).
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sdcp_fast.benchlib import bench_report as reports
from sdcp_fast.benchlib.drive_network import Remote
from sdcp_fast.benchlib.figures import add_speedups, summarize
from sdcp_fast.benchlib.samples import Config, RunSample
from sdcp_fast.benchlib.workload import Workload

TARGET_ONLY = "target-only"


@dataclass
class Plan:
    model: str
    drafters: list[str]
    levels: list[int]
    repeats: int
    workload: Workload
    inprocess: bool = True  # the in-process matrix
    embedded: bool = False
    remote: Remote | None = None
    m: int = 4
    variants: bool = True  # adaptive M and no batching, for the first drafter
    hf: bool = True
    alone: int = 1  # pairs per prompt of each session alone (B = 1), each drafter against target-only; 0: none
    backend: str = "auto"
    device: str = "cpu"
    timeout: float = 600.0
    progress: bool = True
    command: str = ""
    notes: list[str] = field(default_factory=list)


def configurations(plan: Plan) -> list[Config]:
    out = []
    if plan.inprocess:
        out.append(Config(TARGET_ONLY, "inprocess", None, None))
        for d in plan.drafters:
            out.append(Config(d, "inprocess", d, plan.m))
        if plan.drafters and plan.variants:
            d = plan.drafters[0]
            out.append(Config(f"{d}/adaptive-M", "inprocess", d, None))
            out.append(Config(f"{d}/no-batching", "inprocess", d, plan.m, max_batch=1))
    if plan.embedded and plan.drafters:
        out.append(Config(f"up:{plan.drafters[0]}", "embedded", plan.drafters[0], plan.m))
    if plan.remote is not None:
        out.append(Config("remote", "remote", None, None))
    return out


def _prompts(plan: Plan, level: int) -> Workload:
    from dataclasses import replace

    from sdcp_fast.benchlib.workload import take

    n = max(len(plan.workload.prompts), level)
    return replace(plan.workload, prompts=take(list(plan.workload.prompts), n))


def skipped(config: Config, level: int) -> str | None:
    """Why ``config`` is not run at ``level``: work that another configuration already does."""
    if config.max_batch == 1 and level == 1 and config.path == "inprocess":
        return "no cross-session batching at one session in flight is the batched configuration (nothing to batch)"
    if config.path == "hf" and level != 1:
        return "the HF peer runs at batch 1"
    return None


def run(plan: Plan) -> dict[str, Any]:
    import os

    from tqdm import tqdm

    from sdcp_fast.benchlib.drive_local import run_inprocess
    from sdcp_fast.benchlib.drive_network import run_remote
    from sdcp_fast.benchlib.environment import environment

    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    t_start = time.perf_counter()
    load_start = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    configs = configurations(plan)
    target = None
    models: dict[str, bytes] = {}
    drafters: dict[str, Any] = {}
    if plan.inprocess or plan.embedded:
        from sdcp_fast.deploy.catalog import load_drafter, load_target

        target = load_target(plan.model)
        if plan.device != "cpu":
            target = _on_device(target, plan.device)
        models["target"] = target.digest
        models["tokenizer"] = target.tokenizer_digest
        for d in plan.drafters:
            drafters[d] = load_drafter(d, target)
            models[f"drafter:{d}"] = drafters[d][1]
    if plan.hf and plan.drafters and target is not None:
        configs += _hf_configs(plan, target)
    elif plan.hf and target is not None and not plan.remote:
        plan.notes.append("HF assisted generation skipped: no drafter to compare")
    for config in configs:
        if config.max_batch == 1 and config.path == "inprocess" and 1 in plan.levels:
            plan.notes.append(f"{config.name} is not run at 1 session: {skipped(config, 1)}; see "
                              f"{config.drafter} at 1")
    work = [(c, lv) for c in configs for lv in plan.levels if skipped(c, lv) is None]
    if any(c.path == "hf" for c in configs) and 1 not in plan.levels:
        work += [(c, 1) for c in configs if c.path == "hf"]
    total = sum(len(_prompts(plan, lv).prompts) for _, lv in work) * plan.repeats
    alone_configs = [c for c in configs if plan.alone and c.path == "inprocess" and c.drafter is not None
                     and c.name == c.drafter]
    total += 2 * len(alone_configs) * len(plan.workload.prompts) * plan.alone
    alone: dict[str, dict[str, Any]] = {}
    runs: list[RunSample] = []
    bar = tqdm(total=total, unit="session", disable=not plan.progress, dynamic_ncols=True)
    up = None
    deployment: dict[str, Any] | None = None  # how long sdcp-fast up took to start, each process's command line
    try:
        for config in configs:
            remote = plan.remote
            for level in [lv for c, lv in work if c == config]:
                if config.path == "embedded" and up is None:
                    bar.set_description(f"starting sdcp-fast up ({config.drafter})")
                    t = time.perf_counter()
                    up = _start_up(plan, config)
                    deployment = {"start_s": time.perf_counter() - t,
                                  "services": {name: svc.argv for name, svc in up[0].services.items()}}
                if up is not None:
                    remote = up[2]
                bar.set_description(f"{config.name} @{level}")
                workload = _prompts(plan, level)
                if config.path == "inprocess":
                    assert target is not None
                    done = run_inprocess(target, None if config.drafter is None else drafters[config.drafter],
                                         config, workload, level, plan.repeats, backend=plan.backend,
                                         on_session=lambda: bar.update(1), timeout=plan.timeout)
                elif config.path == "hf":
                    from sdcp_fast.benchlib.peers import run_hf

                    assert target is not None
                    done = run_hf(target, config.drafter, config.name, workload, plan.repeats,
                                  on_session=lambda: bar.update(1))
                else:
                    assert remote is not None
                    done = run_remote(remote, config, workload, level, plan.repeats,
                                      on_session=lambda: bar.update(1), timeout=plan.timeout)
                runs += done
                rates = sorted(sum(s.tokens for s in r.samples) / r.wall for r in done if r.wall)
                if rates and plan.progress:
                    bar.write(f"  {config.name} @{level}: {rates[len(rates) // 2]:.1f} tok/s median of {len(rates)} "
                              f"({rates[0]:.1f}-{rates[-1]:.1f})")
            if up is not None:
                up[0].stop()
                up[1].cleanup()
                up = None
        for config in alone_configs:
            from sdcp_fast.benchlib.alone import measure

            assert target is not None and config.drafter is not None
            bar.set_description(f"{config.name} alone vs {TARGET_ONLY}")
            baseline = Config(TARGET_ONLY, "inprocess", None, None)
            alone[config.name] = measure(target, drafters[config.drafter], config, baseline, plan.workload, plan.alone,
                                         backend=plan.backend, timeout=plan.timeout,
                                         on_session=lambda: bar.update(1))
            if plan.progress:
                a = alone[config.name]
                bar.write(f"  {config.name} alone (B = 1): {a['speedup']}x target-only, median of {a['repeats']} "
                          f"pairs ({a['speedup_min']}-{a['speedup_max']}x)")
    finally:
        bar.close()
        if up is not None:
            up[0].stop()
            up[1].cleanup()
    summary: dict[str, dict[int, dict[str, Any]]] = {}
    for config in configs:
        for level in sorted({r.sessions for r in runs if r.config == config.name}):
            summary.setdefault(config.name, {})[level] = summarize(
                [r for r in runs if r.config == config.name and r.sessions == level])
    if TARGET_ONLY in summary:
        rates: dict[tuple[str, int], list[float]] = {}
        for r in runs:
            rates.setdefault((r.config, r.sessions), []).append(
                sum(s.tokens for s in r.samples) / r.wall if r.wall else 0.0)
        add_speedups(summary, TARGET_ONLY, rates)
        if plan.workload.rule == 1:
            _same_as_target_only(summary, runs, plan.notes)
    if plan.remote is not None and target is None:
        plan.notes.append("remote: no target-only figure (the model is not loaded here: pass --model to measure "
                          "target-only decoding in process)")
    for name, levels in summary.items():
        for level, f in levels.items():
            if f["sessions_failed"]:
                common = max(f["problems"], key=f["problems"].get) if f["problems"] else "?"
                plan.notes.append(f"{name}@{level}: {f['sessions_failed']} of {f['sessions']} sessions ended in a "
                                  f"problem, mostly {common!r}" + (
                                      f"; the tokens of {f['sessions_tokens_estimated']} were estimated from the "
                                      "verifiers' emitted count (a failed stream reports no usage)"
                                      if f["sessions_tokens_estimated"] else ""))
    env = environment(models)
    env["load_average_start"] = load_start
    noise = _noise(summary, load_start, env["load_average"], env["cpu_count"])
    if noise:
        plan.notes.append(noise)
    return {
        "schema": reports.SCHEMA, "started": started, "command": plan.command,
        "settings": {"model": target.name if target is not None else (plan.remote.model if plan.remote else None),
                     "drafters": plan.drafters, "levels": plan.levels, "repeats": plan.repeats,
                     "workload": plan.workload.describe(), "max_new": plan.workload.max_new, "rule": plan.workload.rule,
                     "profile": plan.workload.profile, "rate": plan.workload.rate, "m": plan.m,
                     "backend": plan.backend, "warmup": "one session per deployment before the measured runs, "
                                                         "not counted"},
        "configs": [c.to_json() for c in configs],
        "embedded": deployment,
        "environment": env,
        "wall_s": time.perf_counter() - t_start,
        "notes": plan.notes,
        "summary": summary,
        "alone": alone,
        "runs": [r.to_json() for r in runs],
    }


def _noise(summary: dict[str, dict[int, dict[str, Any]]], load_start: list[float] | None,
           load_end: list[float] | None, cpus: int | None) -> str | None:
    """The machine's noise as this run saw it: how far repeats of the same configuration and
    level were apart, and the load average before and after."""
    spreads = sorted(((t["max"] - t["min"]) / t["median"], f"{name}@{level}")
                     for name, levels in summary.items() for level, f in levels.items()
                     for t in [f["tokens_per_s"]] if t["n"] > 1 and t["median"])
    load = (f"load average {load_start[0]:.1f} at the start, {load_end[0]:.1f} at the end on {cpus} CPUs"
            if load_start and load_end else "")
    if not spreads:
        return f"noise: one repeat, no spread measured; {load}" if load else None
    mid = spreads[len(spreads) // 2][0]
    worst, where = spreads[-1]
    return (f"noise: repeats of one configuration and level were {mid:.0%} apart in tokens/s (median over "
            f"configurations; at most {worst:.0%}, {where}); {load}").rstrip("; ")


def _same_as_target_only(summary: dict[str, dict[int, dict[str, Any]]], runs: list[RunSample],
                         notes: list[str]) -> None:
    """Rule 1 is exact (§6.4): every in-process configuration's output must be target-only's."""
    reference = {(r.sessions, s.index): s.output for r in runs if r.config == TARGET_ONLY for s in r.samples}
    short: set[str] = set()
    hf: dict[str, list[int]] = {}
    for run in runs:
        if run.config.startswith("hf-") and (1, 0) in reference:
            # Another implementation of the same checkpoint: agreement is a cross-check, not a rule.
            n = hf.setdefault(run.config, [0, 0])
            n[0] += sum(s.output == reference.get((1, s.index)) for s in run.samples)
            n[1] += len(run.samples)
            continue
        if run.config == TARGET_ONLY or run.config.startswith("hf-") or not run.samples or \
                not isinstance(run.samples[0].output, list):
            continue
        same = True
        for s in run.samples:
            ref, out = reference.get((run.sessions, s.index)) or [], s.output or []
            if out != ref:
                # A session the ladder failed ends early: a prefix is no difference in output.
                if s.finish == "fail" and ref[:len(out)] == out:
                    short.add(f"{run.config}@{run.sessions}")
                else:
                    same = False
        fig = summary[run.config][run.sessions]
        fig["same_as_target_only"] = fig.get("same_as_target_only", True) and same
    differ = [f"{n}@{lv}" for n, levels in summary.items() for lv, f in levels.items()
              if f.get("same_as_target_only") is False]
    notes.append("rule 1: every in-process configuration's output is identical to target-only decoding" if not differ
                 else "rule 1: output differs from target-only decoding in " + ", ".join(differ))
    for name, (same_n, n) in hf.items():
        notes.append(f"{name}: output identical to target-only decoding here in {same_n} of {n} sessions (another "
                     "implementation of the same weights: float rounding can turn a near tie)")
    if short:
        notes.append("sessions failed by the escalation ladder (finish fail, output a prefix of target-only's) in "
                     + ", ".join(sorted(short)))


def _on_device(target: Any, device: str) -> Any:
    """The target moved to ``device`` (drafters built from it share its weights there)."""
    from dataclasses import replace

    from sdcp_fast.model.target_scorer import ModelRunner

    if target.loaded is None:
        raise ValueError(f"--device {device}: the {target.name} target has no weights to move")
    target.loaded.model.to(device)
    return replace(target, scorer=ModelRunner(target.loaded.model))


def _hf_configs(plan: Plan, target: Any) -> list[Config]:
    """The HF peers, or none with the reason in the notes."""
    from sdcp_fast.benchlib.peers import hf_unavailable

    d = plan.drafters[0]
    why = hf_unavailable(target, d)
    if why is None and plan.workload.rule == 2:
        why = "rule 2: HF's sampling draws other randoms, so the outputs are not comparable"
    if why is not None:
        plan.notes.append(f"HF assisted generation skipped: {why}")
        return []
    return [Config("hf-greedy", "hf", None, None, max_batch=1), Config(f"hf-assisted:{d}", "hf", d, None, max_batch=1)]


def _start_up(plan: Plan, config: Config) -> tuple[Any, Any, Remote]:
    """``sdcp-fast up`` with the configuration's drafter, M and batch limit (and the device)."""
    from sdcp_fast.deploy.up import Up

    device = None if plan.device == "cpu" else plan.device
    tmp = tempfile.TemporaryDirectory(prefix="sdcp-bench-up-")
    up = Up(Path(tmp.name), model=plan.model, drafters=(config.drafter,) if config.drafter else None,
            fixed_m=config.m, max_batch=config.max_batch, device=device)
    try:
        up.start()
    except Exception:
        up.stop()
        tmp.cleanup()
        raise
    e = up.endpoints()
    verifiers = [s.uri for s in up.services.values() if s.role == "verifier"]
    return up, tmp, Remote(up.services["router"].uri, e["ca"], e["client_cert"], e["client_key"], verifiers)


def finish(report: dict[str, Any], out: Path, plots: bool = True) -> list[Path]:
    """Writes report.json and the PNGs into ``out``; the paths written."""
    reports.write(out / "report.json", report)
    written = [out / "report.json"]
    if plots:
        import importlib.util

        if importlib.util.find_spec("matplotlib") is None:
            print("no plots: matplotlib is not installed (pip install 'sdcp-fast[bench]')")
            return written
        from sdcp_fast.benchlib.plots import plot

        written += plot(report, out)
    return written
