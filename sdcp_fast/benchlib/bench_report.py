"""The report: ``report.json`` (settings, environment, raw samples, figures), the summary
table, and the differences between two reports (``--compare``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SCHEMA = "sdcp-fast/bench/1"


def write(path: Path, report: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1, default=str) + "\n")


def load(path: Path) -> dict[str, Any]:
    report = json.loads(Path(path).read_text())
    if report.get("schema") != SCHEMA:
        raise ValueError(f"{path}: not a bench report ({SCHEMA})")
    return report  # type: ignore[no-any-return]


def _f(value: Any, fmt: str = ".1f", scale: float = 1.0) -> str:
    return "-" if value is None else format(value * scale, fmt)


COLUMNS = (
    ("config", 26), ("sess", 4), ("tok/s", 7), ("spread", 13), ("x", 5), ("bound", 5), ("ttft p50/p99 ms", 15),
    ("itl p50/p99 ms", 14), ("accept", 6), ("acc/rd", 6), ("tok/pass", 8), ("batch", 5), ("esc", 4), ("prob", 4),
)


def rows(summary: dict[str, dict[str, dict[str, Any]]]) -> list[list[str]]:
    out = []
    for name, levels in summary.items():
        for level, f in levels.items():
            t = f["tokens_per_s"]
            out.append([
                name, str(level), _f(t["median"]), f"{_f(t['min'])}-{_f(t['max'])} n{t['n']}",
                _f(f.get("speedup"), ".2f"), _f(f.get("speedup_bound"), ".2f"),
                f"{_f(f['ttft_s']['p50'], '.0f', 1e3)}/{_f(f['ttft_s']['p99'], '.0f', 1e3)}",
                f"{_f(f['itl_s']['p50'], '.1f', 1e3)}/{_f(f['itl_s']['p99'], '.1f', 1e3)}",
                _f(f["acceptance"], ".3f"), _f(f["accepted_per_round"], ".2f"), _f(f["tokens_per_pass"], ".2f"),
                _f(f["mean_batch"], ".1f"), str(sum(f["escalations"].values())), str(sum(f["problems"].values())),
            ])
    return out


def table(summary: dict[str, dict[str, dict[str, Any]]]) -> str:
    lines = ["  ".join(h.ljust(w) for h, w in COLUMNS)]
    for row in rows(summary):
        lines.append("  ".join(c.ljust(w) for c, (_, w) in zip(row, COLUMNS, strict=True)))
    return "\n".join(lines)


def breakdown_table(summary: dict[str, dict[str, dict[str, Any]]]) -> str:
    lines = ["time per committed round, ms (in process: the parts add up to the wall time; remote: the verifier's "
             "verdict latency and the rest of a session's time)"]
    for name, levels in summary.items():
        for level, f in levels.items():
            b = f.get("breakdown_s_per_round")
            if b:
                parts = "  ".join(f"{k} {v * 1e3:.2f}" for k, v in b.items())
                lines.append(f"  {name} @{level}: {parts}")
    return "\n".join(lines)


def compare(a: dict[str, Any], b: dict[str, Any]) -> str:
    """Per configuration and level present in both: the main figures of A, of B, and B/A."""
    keys = (("tokens/s", ("tokens_per_s", "median")), ("ttft p50 s", ("ttft_s", "p50")),
            ("itl p50 s", ("itl_s", "p50")), ("acceptance", ("acceptance",)),
            ("tokens/pass", ("tokens_per_pass",)), ("speedup", ("speedup",)))

    def get(f: dict[str, Any], path: tuple[str, ...]) -> float | None:
        v: Any = f
        for p in path:
            v = v.get(p) if isinstance(v, dict) else None
        return v if isinstance(v, int | float) else None

    lines = [f"A: {a['environment']['git']['commit'] or '?'} {a['started']}  ({a['command']})",
             f"B: {b['environment']['git']['commit'] or '?'} {b['started']}  ({b['command']})",
             f"{'config':26} {'sess':>4} {'figure':12} {'A':>10} {'B':>10} {'B/A':>7}"]
    common = 0
    for name, levels in a["summary"].items():
        for level, fa in levels.items():
            fb = b["summary"].get(name, {}).get(level)
            if fb is None:
                continue
            common += 1
            for label, path in keys:
                va, vb = get(fa, path), get(fb, path)
                if va is None and vb is None:
                    continue
                ratio = f"{vb / va:.2f}" if va and vb is not None else "-"
                lines.append(f"{name:26} {level:>4} {label:12} {_f(va, '.4g'):>10} {_f(vb, '.4g'):>10} {ratio:>7}")
    for name, fa in (a.get("alone") or {}).items():
        fb = (b.get("alone") or {}).get(name)
        if fb is not None:
            for label, key in (("B=1 tok/s", "speculative"), ("B=1 t-o tok/s", "target_only")):
                va, vb = (f["tokens_per_s_per_session"][key]["median"] for f in (fa, fb))
                lines.append(f"{name:26} {'1':>4} {label:12} {_f(va, '.4g'):>10} {_f(vb, '.4g'):>10} "
                             f"{vb / va if va else 0:>7.2f}")
            lines.append(f"{name:26} {'1':>4} {'B=1 speedup':12} {_f(fa['speedup'], '.4g'):>10} "
                         f"{_f(fb['speedup'], '.4g'):>10} {fb['speedup'] / fa['speedup']:>7.2f}")
    only = sorted({f"{n}@{lv}" for n, ls in a["summary"].items() for lv in ls} ^
                  {f"{n}@{lv}" for n, ls in b["summary"].items() for lv in ls})
    if only:
        lines.append("in one report only: " + ", ".join(only))
    if not common:
        lines.append("no configuration in common")
    return "\n".join(lines)


def alone_table(report: dict[str, Any]) -> str:
    """Each session alone (B = 1) beside the batched figure: per drafter, each side's
    per-session tokens/s and the speedup (median, range) of the interleaved one-session
    pairs, and the speedup at the highest level measured."""
    alone = report.get("alone") or {}
    if not alone:
        return ""
    top = max(report["settings"]["levels"])
    lines = ["each session alone (B = 1: one session in flight, its speculative and target-only runs interleaved, "
             f"one prompt per pair), beside the speedup at {top} sessions in flight:",
             f"{'config':26} {'pairs':>5} {'tok/s':>6} {'spread':>13} {'t-o tok/s':>9} {'spread':>13} "
             f"{'x B=1':>5} {'x range':>11} {f'x @{top}':>6} {'same':>4}"]
    for name, f in alone.items():
        spec, base = f["tokens_per_s_per_session"]["speculative"], f["tokens_per_s_per_session"]["target_only"]
        batched = report["summary"].get(name, {})
        at_top = batched.get(str(top), batched.get(top, {})).get("speedup")
        same = f["identical_output"]
        ranges = [f"{a['min']}-{a['max']}" for a in (spec, base)] + [f"{f['speedup_min']}-{f['speedup_max']}"]
        lines.append(f"{name:26} {f['repeats']:>5} {spec['median']:>6.1f} {ranges[0]:>13} {base['median']:>9.1f} "
                     f"{ranges[1]:>13} {f['speedup']:>5.2f} {ranges[2]:>11} {_f(at_top, '.2f'):>6} "
                     f"{'-' if same is None else 'yes' if all(same) else 'NO':>4}")
    lines.append("  tok/s: per session, speculative then target-only (t-o); the ranges cover the prompts as well as "
                 "the load")
    return "\n".join(lines)


PEER_KINDS = {"inprocess": "SDCP, roles in one process", "embedded": "SDCP, sdcp-fast up over HTTP/2 + mTLS",
              "hf": "HF transformers generate", "remote": "SDCP, the remote deployment"}


def peers_table(report: dict[str, Any]) -> str:
    """The peers side by side at one session in flight (batch 1): target-only and the first
    drafter in process, the same over the network, HF greedy and assisted generation; then
    what distribution costs at every level both were measured at."""
    summary, drafters = report["summary"], report["settings"]["drafters"]
    first = drafters[0] if drafters else None
    kinds = {c["name"]: c["path"] for c in report["configs"]}
    names = [n for n in summary if n == "target-only" or n == first or kinds.get(n) in ("embedded", "hf", "remote")]
    lines = ["peers side by side, one session in flight (batch 1):",
             f"{'config':26} {'what':38} {'tok/s':>6} {'spread':>11} {'x':>5} {'ttft p50 ms':>11} "
             f"{'itl p50 ms':>10} {'accept':>6}"]
    for name in names:
        f = summary[name].get("1", summary[name].get(1))  # type: ignore[call-overload]
        if f is None:
            continue
        t = f["tokens_per_s"]
        lines.append(f"{name:26} {PEER_KINDS.get(kinds.get(name, ''), ''):38} {_f(t['median']):>6} "
                     f"{_f(t['min']) + '-' + _f(t['max']):>11} {_f(f.get('speedup'), '.2f'):>5} "
                     f"{_f(f['ttft_s']['p50'], '.0f', 1e3):>11} {_f(f['itl_s']['p50'], '.1f', 1e3):>10} "
                     f"{_f(f['acceptance'], '.3f'):>6}")
    up = next((n for n in summary if kinds.get(n) == "embedded"), None)
    if up and first in summary:
        costs = []
        for level, f in summary[up].items():
            base = summary[first].get(level)
            if base and base["tokens_per_s"]["median"] and f["tokens_per_s"]["median"]:
                costs.append(f"{f['tokens_per_s']['median'] / base['tokens_per_s']['median']:.2f} at {level}")
        if costs:
            lines.append(f"distribution: {up} makes {', '.join(costs)} sessions the tokens/s of {first} in process")
    if not any(kinds.get(n) == "hf" for n in names):
        lines.append("HF transformers: not measured (" + next(
            (n.split(": ", 1)[1] for n in report["notes"] if n.startswith("HF assisted generation skipped")),
            "not asked for") + ")")
    return "\n".join(lines)


def text(report: dict[str, Any]) -> str:
    """What a finished run prints: the tables, the notes, the machine and the command."""
    lines = [table(report["summary"]), "", breakdown_table(report["summary"]), "", peers_table(report)]
    alone = alone_table(report)
    if alone:
        lines += ["", alone]
    lines += [f"note: {note}" for note in report["notes"]]
    la = report["environment"]["load_average"]
    if la:
        lines.append(f"machine: {report['environment']['cpu_count']} CPUs, load average {la[0]:.1f} at the end "
                     "(figures on a shared machine vary: see the spread)")
    lines.append(f"wall time {report['wall_s']:.0f} s; command: {report['command']}")
    return "\n".join(lines)
