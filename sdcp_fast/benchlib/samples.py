"""The raw samples a bench run records, as report.json keeps them (times in seconds, relative
to the start of the measured run)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class Config:
    """One configuration compared in a run."""

    name: str
    path: str  # inprocess, embedded (sdcp-fast up on loopback), remote, hf
    drafter: str | None = None  # None: target-only decoding
    m: int | None = 4  # fixed M; None: §6.2's adaptive M
    max_batch: int = 64  # 1: no cross-session batching

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class SessionSample:
    index: int
    kind: str
    arrived: float  # when the workload released it
    opened: float  # when it was submitted
    first: float | None = None  # first output token
    finished: float | None = None
    tokens: int = 0
    # Output as it arrived: (time, tokens in that piece); pieces of text for a remote run.
    chunks: list[tuple[float, int]] = field(default_factory=list)
    rounds: int = 0
    proposed: int = 0
    accepted: int = 0
    finish: str | None = None
    problems: list[str] = field(default_factory=list)
    output: list[int] | str | None = None
    tokens_estimated: bool = False  # remote, no usage reported (docs/benchmarks.md)


@dataclass(frozen=True)
class RoundSample:
    t: float
    session: int
    drafter: str | None
    proposed: int
    accepted: int
    emitted: int
    action: str
    m_cap: int
    batch: int


@dataclass
class RunSample:
    """One measured run: one configuration, one concurrency level, one repeat."""

    config: str
    sessions: int  # concurrency level (sessions in flight at most)
    repeat: int
    wall: float = 0.0
    samples: list[SessionSample] = field(default_factory=list)
    rounds: list[RoundSample] = field(default_factory=list)
    passes: list[tuple[int, float]] = field(default_factory=list)  # (batch size, seconds) per target pass
    # Seconds spent per part of a round, summed over the run (docs/benchmarks.md says which).
    phases: dict[str, float] = field(default_factory=dict)
    drafted_tokens: int = 0
    counters: dict[str, float] = field(default_factory=dict)  # metrics of the deployment (remote)
    problems: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> RunSample:
        d = dict(d)
        d["samples"] = [SessionSample(**{**s, "chunks": [tuple(c) for c in s["chunks"]]}) for s in d["samples"]]
        d["rounds"] = [RoundSample(**r) for r in d["rounds"]]
        d["passes"] = [tuple(p) for p in d["passes"]]
        return cls(**d)
