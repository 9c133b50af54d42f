"""bench/protocol.py's goals: each with its target, the figure over ``--repeats`` (median and
spread), PASS or FAIL, and the load average while it was measured, for each server measured
(``--servers``). The figures are the throughput levels' and the echo's rows of the run, as
bench/protocol.py writes them to its JSON (``server``, ``repeat``, ``load`` in each row)."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

Row = dict[str, Any]

# A round of bench/protocol.py commits M + 1 = 5 tokens when all is accepted (a session's last
# round fewer): a level below this had its rounds shortened (the verifier's load rule lowering
# m_cap), and its rounds are not the ones the goals are set for: cheaper, so they pass nothing.
MIN_TOKENS = 4.5


@dataclass(frozen=True)
class Goal:
    name: str
    unit: str
    target: float
    at_least: bool  # True: the figure must be >= target; False: <= target (strictly < where ``strict``)
    rule: int
    concurrency: int
    figure: Callable[[Row, Sequence[Row]], float | None]  # (level row, echo rows of its server and repeat)
    strict: bool = False

    def passes(self, value: float) -> bool:
        if self.at_least:
            return value >= self.target
        return value < self.target if self.strict else value <= self.target

    def target_text(self) -> str:
        op = ">=" if self.at_least else ("<" if self.strict else "<=")
        return f"{op} {self.target:g} {self.unit}"


def _rps(row: Row, _: Sequence[Row]) -> float:
    return float(row["rps"])


def _cpu(role: str) -> Callable[[Row, Sequence[Row]], float]:
    return lambda row, _: float(row["cpu_us_per_round"][role])


def _p99(row: Row, _: Sequence[Row]) -> float:
    return float(row["p99_ms"])


def _over_echo(row: Row, echo: Sequence[Row]) -> float | None:
    same = [e["rps"] for e in echo if e["concurrency"] == row["concurrency"]]
    return float(row["rps"]) / same[0] if same and same[0] > 0 else None


GOALS = (
    Goal("rule-1 rounds/s at 256 sessions", "rounds/s", 5000, True, 1, 256, _rps),
    Goal("rule-2 rounds/s at 256 sessions (V = 32,000)", "rounds/s", 2000, True, 2, 256, _rps),
    *(Goal(f"verifier CPU per round, rule {rule}, {n} sessions", "us", 150, False, rule, n, _cpu("verifier"))
      for n in (64, 256) for rule in (1, 2)),
    *(Goal(f"MLC CPU per round, rule {rule}, {n} sessions", "us", 60, False, rule, n, _cpu("mlc"))
      for n in (64, 256) for rule in (1, 2)),
    Goal("rule-1 rounds/s over the native echo's req/s at 64", "x", 0.5, True, 1, 64, _over_echo),
    Goal("p99 verdict latency at 64 sessions, rule 1", "ms", 20, False, 1, 64, _p99, strict=True),
    Goal("p99 verdict latency at 64 sessions, rule 2", "ms", 20, False, 2, 64, _p99, strict=True),
)


def evaluate(levels: Sequence[Row], echo: Sequence[Row], server: str, echo_server: str) -> list[Row]:
    """Each goal measured in this run for ``server`` (its rounds over ``echo_server``'s echo):
    the figure of every repeat, their median and spread, PASS/FAIL on the median, the load."""
    out: list[Row] = []
    for goal in GOALS:
        values: list[float] = []
        loads: list[float] = []
        tokens: list[float] = []
        for row in levels:
            if (row.get("server"), row["rule"], row["concurrency"]) != (server, goal.rule, goal.concurrency):
                continue
            echoes = [e for e in echo if e.get("server") == echo_server and e.get("repeat") == row.get("repeat")]
            value = goal.figure(row, echoes)
            if value is not None:
                values.append(value)
                loads.append(float(row.get("load", 0.0)))
                tokens.append(float(row.get("tokens_per_round", MIN_TOKENS)))
        if not values:
            continue
        median = statistics.median(values)
        short = min(tokens) < MIN_TOKENS
        out.append({"goal": goal.name, "server": server, "target": goal.target_text(), "median": median,
                    "min": min(values), "max": max(values), "repeats": len(values),
                    "load": [min(loads), max(loads)], "tokens_per_round": [min(tokens), max(tokens)],
                    "pass": goal.passes(median) and not short})
    return out


UP_GOAL = 200.0  # us of verifier CPU per committed round in sdcp-fast up, 16 streams, session set-up counted


def evaluate_up(rows: Sequence[Row]) -> list[Row]:
    """The deployment goal over bench/protocol_up.py's rows (one per repeat), as :func:`evaluate`'s."""
    if not rows:
        return []
    values = [float(r["verifier_us_per_round"]) for r in rows]
    loads = [float(r["load"]) for r in rows]
    median = statistics.median(values)
    return [{"goal": f"verifier CPU per committed round in sdcp-fast up --model toy, {rows[0]['streams']} streams",
             "server": rows[0].get("server", ""), "target": f"<= {UP_GOAL:g} us", "median": median,
             "min": min(values), "max": max(values), "repeats": len(values), "load": [min(loads), max(loads)],
             "pass": median <= UP_GOAL}]


def _number(x: float) -> str:
    return f"{x:,.2f}" if abs(x) < 10 else f"{x:,.0f}"


def report(rows: Sequence[Row]) -> str:
    """The goals as text, one line each."""
    lines = []
    for r in rows:
        spread = f"{_number(r['min'])}-{_number(r['max'])}" if r["repeats"] > 1 else "one run"
        tokens = r.get("tokens_per_round")
        short = f"; rounds shortened to {tokens[0]:.2f} tokens" if tokens and tokens[0] < MIN_TOKENS else ""
        lines.append(f"  [{'PASS' if r['pass'] else 'FAIL'}] {r['server']:6s} {r['goal']}: {_number(r['median'])} "
                     f"(spread {spread}, {r['repeats']} repeat{'s' if r['repeats'] != 1 else ''}; target "
                     f"{r['target']}; load {r['load'][0]:.1f}-{r['load'][1]:.1f}{short})")
    return "\n".join(lines)
