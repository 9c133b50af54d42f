"""PNG plots of a report (matplotlib, no display): throughput against concurrency, latency
CDFs, the acceptance histogram and the time per round by part."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sdcp_fast.benchlib.figures import PHASE_ORDER, itl


def _levels(levels: dict[Any, Any]) -> list[tuple[int, Any]]:
    return sorted(((int(k), v) for k, v in levels.items()), key=lambda kv: kv[0])


def plot(report: dict[str, Any], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    summary = report["summary"]
    written = []
    title = f"{report['settings']['model']} · {report['settings']['workload']}"

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, levels in summary.items():
        pts = [(lv, f["tokens_per_s"]) for lv, f in _levels(levels) if f["tokens_per_s"]["median"] is not None]
        if not pts:
            continue
        x = [p[0] for p in pts]
        med = [p[1]["median"] for p in pts]
        lo = [p[1]["median"] - p[1]["min"] for p in pts]
        hi = [p[1]["max"] - p[1]["median"] for p in pts]
        ax.errorbar(x, med, yerr=[lo, hi], marker="o", capsize=3, label=name)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("sessions in flight")
    ax.set_ylabel("output tokens/s (median, min-max over repeats)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    written.append(_save(fig, out / "throughput.png"))

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
    colors = {name: f"C{i % 10}" for i, name in enumerate(summary)}  # one colour per configuration in both
    for name, level, ttft, lat in _latencies(report):
        for ax, values in ((a1, ttft), (a2, lat)):
            if values:
                v = sorted(x * 1e3 for x in values)
                ax.plot(v, [(i + 1) / len(v) for i in range(len(v))], label=f"{name} @{level}", color=colors.get(name))
    a1.set_xlabel("time to first token, ms")
    a2.set_xlabel("inter-token latency, ms")
    for ax in (a1, a2):
        ax.set_ylabel("fraction of samples")
        ax.set_xscale("log")
        ax.grid(alpha=0.3)
    a1.legend(fontsize=7)
    fig.suptitle(f"latency CDFs, each configuration at its highest concurrency level · {title}", fontsize=9)
    written.append(_save(fig, out / "latency_cdf.png"))

    fig, ax = plt.subplots(figsize=(7, 4))
    drawn = [(n, f) for n, levels in summary.items() for lv, f in _levels(levels)[-1:] if f["acceptance_histogram"]]
    width = 0.8 / max(1, len(drawn))
    for i, (name, f) in enumerate(drawn):
        hist = {int(k): v for k, v in f["acceptance_histogram"].items()}
        total = sum(hist.values())
        ax.bar([k + i * width for k in hist], [v / total for v in hist.values()], width=width, label=name)
    ax.set_xlabel("draft tokens accepted in a round")
    ax.set_ylabel("fraction of rounds")
    ax.set_title(f"acceptance per round · {title}", fontsize=9)
    if drawn:
        ax.legend(fontsize=7)
    written.append(_save(fig, out / "acceptance.png"))

    fig, ax = plt.subplots(figsize=(8, 4.5))
    bars = [(f"{n}@{lv}", f["breakdown_s_per_round"]) for n, levels in summary.items()
            for lv, f in _levels(levels)[:1] if f.get("breakdown_s_per_round")]
    for part in PHASE_ORDER:
        bottoms = [sum(v * 1e3 for k, v in b.items() if PHASE_ORDER.index(k) < PHASE_ORDER.index(part))
                   for _, b in bars]
        values = [b.get(part, 0.0) * 1e3 for _, b in bars]
        if any(values):
            ax.bar([label for label, _ in bars], values, bottom=bottoms, label=part)
    ax.set_ylabel("ms per committed round")
    ax.set_title(f"where the time goes (lowest concurrency level) · {title}", fontsize=9)
    ax.tick_params(axis="x", labelrotation=30, labelsize=7)
    if bars:
        ax.legend(fontsize=7)
    written.append(_save(fig, out / "breakdown.png"))
    return written


def _latencies(report: dict[str, Any]) -> list[tuple[str, int, list[float], list[float]]]:
    """TTFT and ITL samples of each configuration at its highest level (the HF peers: 1)."""
    top: dict[str, int] = {}
    for run in report["runs"]:
        top[run["config"]] = max(top.get(run["config"], 0), run["sessions"])
    out: dict[str, tuple[list[float], list[float]]] = {}
    for run in report["runs"]:
        if run["sessions"] != top[run["config"]]:
            continue
        ttft, lat = out.setdefault(run["config"], ([], []))
        for s in run["samples"]:
            if s["first"] is not None:
                ttft.append(s["first"] - s["arrived"])
            lat.extend(x for x in itl([tuple(c) for c in s["chunks"]]) if x > 0)
    return [(n, top[n], t, la) for n, (t, la) in out.items()]


def _save(fig: Any, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
