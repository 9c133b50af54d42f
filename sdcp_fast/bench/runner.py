"""One bench run: the configurations, each at each concurrency level and repeated, with the
same prompts on the same machine; then the figures, report.json and the plots.

In process (``sdcp_fast.engine.inprocess``) a deployment can be started with anything, so
the comparison lives there: target-only decoding (no drafter: the verifier decodes every
session itself), each drafter with a fixed M, the first drafter with §6.2's adaptive M and
without cross-session batching (a verifier scoring one session per pass). Over the network a
deployment is what it was started with: ``--embedded`` starts ``sdcp-fast up`` with the
first drafter (adaptive M, as its drafters run), which sits next to the in-process
``<drafter>/adaptive-M`` to show what distribution costs; ``--router`` measures a running
deployment, whose target-only figure is measured in process when its model is here.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sdcp_fast.bench import report as reports
from sdcp_fast.bench.remote import Remote
from sdcp_fast.bench.samples import Config, RunSample
from sdcp_fast.bench.stats import add_speedups, summarize
from sdcp_fast.bench.workload import Workload

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
        out.append(Config(f"up:{plan.drafters[0]}", "embedded", plan.drafters[0], None))
    if plan.remote is not None:
        out.append(Config("remote", "remote", None, None))
    return out


def _prompts(plan: Plan, level: int) -> Workload:
    from dataclasses import replace

    from sdcp_fast.bench.workload import take

    n = max(len(plan.workload.prompts), level)
    return replace(plan.workload, prompts=take(list(plan.workload.prompts), n))


def run(plan: Plan) -> dict[str, Any]:
    from tqdm import tqdm

    from sdcp_fast.bench.environment import environment
    from sdcp_fast.bench.inprocess import run_inprocess
    from sdcp_fast.bench.remote import run_remote

    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    configs = configurations(plan)
    target = None
    models: dict[str, bytes] = {}
    drafters: dict[str, Any] = {}
    if plan.inprocess or plan.embedded:
        from sdcp_fast.services.models import load_drafter, load_target

        target = load_target(plan.model)
        if plan.device != "cpu":
            target = _on_device(target, plan.device)
        models["target"] = target.digest
        models["tokenizer"] = target.tokenizer_digest
        for d in plan.drafters:
            drafters[d] = load_drafter(d, target)
            models[f"drafter:{d}"] = drafters[d][1]
    total = sum(len(_prompts(plan, lv).prompts) for lv in plan.levels) * plan.repeats * len(configs)
    runs: list[RunSample] = []
    bar = tqdm(total=total, unit="session", disable=not plan.progress, dynamic_ncols=True)
    up = None
    try:
        for config in configs:
            remote = plan.remote
            if config.path == "embedded":
                bar.set_description(f"starting sdcp-fast up ({config.drafter})")
                up, remote = _start_up(plan, config)
            for level in plan.levels:
                bar.set_description(f"{config.name} @{level}")
                workload = _prompts(plan, level)
                if config.path == "inprocess":
                    assert target is not None
                    runs += run_inprocess(target, None if config.drafter is None else drafters[config.drafter],
                                          config, workload, level, plan.repeats, backend=plan.backend,
                                          on_session=lambda: bar.update(1), timeout=plan.timeout)
                else:
                    assert remote is not None
                    runs += run_remote(remote, config, workload, level, plan.repeats,
                                       on_session=lambda: bar.update(1), timeout=plan.timeout)
            if up is not None:
                up[0].stop()
                up[1].cleanup()
                up = None
    finally:
        bar.close()
        if up is not None:
            up[0].stop()
            up[1].cleanup()
    if plan.hf and plan.drafters and target is not None:
        from sdcp_fast.bench.peers import hf_unavailable, run_hf

        why = hf_unavailable(target, plan.drafters[0])
        if why is None and plan.workload.rule == 2:
            why = "rule 2: HF's sampling draws other randoms, so the outputs are not comparable"
        if why is None:
            configs.append(Config("hf-greedy", "hf", None, None, max_batch=1))
            configs.append(Config(f"hf-assisted:{plan.drafters[0]}", "hf", plan.drafters[0], None, max_batch=1))
            runs += run_hf(target, plan.drafters[0], _prompts(plan, 1))
        else:
            plan.notes.append(f"HF assisted generation skipped: {why}")
    summary: dict[str, dict[int, dict[str, Any]]] = {}
    for config in configs:
        for level in sorted({r.sessions for r in runs if r.config == config.name}):
            summary.setdefault(config.name, {})[level] = summarize(
                [r for r in runs if r.config == config.name and r.sessions == level])
    if TARGET_ONLY in summary:
        add_speedups(summary, TARGET_ONLY)
        if plan.workload.rule == 1:
            _same_as_target_only(summary, runs, plan.notes)
    if plan.embedded and plan.device != "cpu":
        plan.notes.append(f"--device {plan.device} applies to the in-process configurations; sdcp-fast up's "
                          "services choose their own device")
    if plan.remote is not None and target is None:
        plan.notes.append("remote: no target-only figure (the model is not loaded here: pass --model to measure "
                          "target-only decoding in process)")
    return {
        "schema": reports.SCHEMA, "started": started, "command": plan.command,
        "settings": {"model": target.name if target is not None else (plan.remote.model if plan.remote else None),
                     "drafters": plan.drafters, "levels": plan.levels, "repeats": plan.repeats,
                     "workload": plan.workload.describe(), "max_new": plan.workload.max_new, "rule": plan.workload.rule,
                     "profile": plan.workload.profile, "rate": plan.workload.rate, "m": plan.m,
                     "backend": plan.backend, "warmup": "one session per deployment before the measured runs, "
                                                         "not counted"},
        "configs": [c.to_json() for c in configs],
        "environment": environment(models),
        "notes": plan.notes,
        "summary": summary,
        "runs": [r.to_json() for r in runs],
    }


def _same_as_target_only(summary: dict[str, dict[int, dict[str, Any]]], runs: list[RunSample],
                         notes: list[str]) -> None:
    """Rule 1 is exact (§6.4): every in-process configuration's output must be target-only's."""
    reference = {(r.sessions, s.index): s.output for r in runs if r.config == TARGET_ONLY for s in r.samples}
    short: set[str] = set()
    for run in runs:
        if run.config == TARGET_ONLY or not run.samples or not isinstance(run.samples[0].output, list):
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
    if short:
        notes.append("sessions failed by the escalation ladder (finish fail, output a prefix of target-only's) in "
                     + ", ".join(sorted(short)))


def _on_device(target: Any, device: str) -> Any:
    """The target moved to ``device`` (drafters built from it share its weights there)."""
    from dataclasses import replace

    from sdcp_fast.model.runner import ModelRunner

    if target.loaded is None:
        raise ValueError(f"--device {device}: the {target.name} target has no weights to move")
    target.loaded.model.to(device)
    return replace(target, scorer=ModelRunner(target.loaded.model))


def _start_up(plan: Plan, config: Config) -> tuple[tuple[Any, Any], Remote]:
    from sdcp_fast.services.up import Up

    tmp = tempfile.TemporaryDirectory(prefix="sdcp-bench-up-")
    up = Up(Path(tmp.name), model=plan.model, drafters=(config.drafter,) if config.drafter else None)
    try:
        up.start()
    except Exception:
        up.stop()
        tmp.cleanup()
        raise
    e = up.endpoints()
    verifiers = [s.uri for s in up.services.values() if s.role == "verifier"]
    return (up, tmp), Remote(up.services["router"].uri, e["ca"], e["client_cert"], e["client_key"], verifiers)


def finish(report: dict[str, Any], out: Path, plots: bool = True) -> list[Path]:
    """Writes report.json and the PNGs into ``out``; the paths written."""
    reports.write(out / "report.json", report)
    written = [out / "report.json"]
    if plots:
        import importlib.util

        if importlib.util.find_spec("matplotlib") is None:
            print("no plots: matplotlib is not installed (pip install 'sdcp-fast[bench]')")
            return written
        from sdcp_fast.bench.plots import plot

        written += plot(report, out)
    return written
