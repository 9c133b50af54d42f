"""What a bench run sends: the prompts, their sampling profile, output length and arrivals.

Built-in prompts (``sdcp_fast/data/bench_prompts.json``): prose, code, lists and
repetition-heavy text for a real model (n-gram drafters shine on repetition, small models on
prose), and a ``toy`` kind in the toy model's words. ``--prompts FILE.jsonl`` replaces them:
one ``{"text": ..., "kind": ...}`` per line (``kind`` optional).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from sdcp_fast.data import HERE as DATA

REAL_KINDS = ("prose", "code", "list", "repeat")

# Rule 2 sampling profiles (§4.1 sampling): (temperature, top_p, top_k).
PROFILES: dict[str, tuple[float, float | None, int | None]] = {
    "sample": (0.8, None, None),
    "nucleus": (0.7, 0.9, None),
    "topk": (1.0, None, 40),
}


@dataclass(frozen=True)
class Prompt:
    index: int
    kind: str
    text: str


@dataclass(frozen=True)
class Workload:
    prompts: tuple[Prompt, ...]
    max_new: int
    rule: int = 1
    profile: str | None = None  # rule 2 only, a key of PROFILES
    rate: float | None = None  # sessions per second (open loop, Poisson); None: closed loop
    seed: int = 0

    def describe(self) -> str:
        loop = f"open loop, Poisson {self.rate}/s" if self.rate else "closed loop"
        rule = "rule 1 (greedy)" if self.rule == 1 else f"rule 2 ({self.profile})"
        return f"{len(self.prompts)} prompts, {self.max_new} new tokens, {rule}, {loop}"

    def sampling(self, index: int) -> tuple[float, float | None, int | None, int] | None:
        """(temperature, top_p, top_k, seed) of the ``index``-th session, None for rule 1."""
        if self.rule == 1:
            return None
        t, p, k = PROFILES[self.profile or "sample"]
        return t, p, k, self.seed * 100_003 + index

    def arrivals(self, n: int) -> list[float]:
        """Offsets in seconds at which the first ``n`` sessions arrive (all 0 in closed loop)."""
        if not self.rate:
            return [0.0] * n
        rng = random.Random(self.seed)
        t, out = 0.0, []
        for _ in range(n):
            out.append(t)
            t += rng.expovariate(self.rate)
        return out


def builtin(toy: bool, kinds: tuple[str, ...] | None = None, *, eval_set: bool = False) -> list[Prompt]:
    """The bench prompts, or with ``eval_set`` the measurement prompts of docs/models.md
    (``sdcp_fast/data/prompts.json``: chat and copy)."""
    if eval_set and not toy:
        from sdcp_fast.data import prompts

        return [Prompt(i, p["kind"], p["text"]) for i, p in enumerate(prompts("eval"))]
    data = json.loads((DATA / "bench_prompts.json").read_text())
    wanted = ("toy",) if toy else (kinds or REAL_KINDS)
    # Interleave the kinds, so that a short run still sees each of them.
    columns = [[(k, t) for t in data[k]] for k in wanted]
    mixed = [row[i] for i in range(max(map(len, columns))) for row in columns if i < len(row)]
    return [Prompt(i, k, t) for i, (k, t) in enumerate(mixed)]


def from_file(path: Path) -> list[Prompt]:
    out = []
    for line in path.read_text().splitlines():
        if line.strip():
            item = json.loads(line)
            out.append(Prompt(len(out), str(item.get("kind", "file")), str(item["text"])))
    if not out:
        raise ValueError(f"{path}: no prompts")
    return out


def take(prompts: list[Prompt], n: int) -> tuple[Prompt, ...]:
    """``n`` prompts, cycling through the set when it has fewer."""
    return tuple(Prompt(i, prompts[i % len(prompts)].kind, prompts[i % len(prompts)].text) for i in range(n))
