"""What the conformance kit found: one line per check, each quoting the draft's sentence.

Outcomes: ``pass``; ``fail``; ``not reachable`` (the kit could not exercise the statement from
outside, and says why); ``interpretation`` (the implementation made a choice the draft leaves
to it, e.g. refusing rule 2 or a SHOULD it does not follow: reported, never counted as a
failure).
"""

from __future__ import annotations

import enum
import json
from dataclasses import asdict, dataclass, field

from sdcp_fast.conform.statements import CHECKS, Check


class Outcome(enum.Enum):
    PASS = "pass"
    FAIL = "fail"
    UNREACHABLE = "not reachable"
    INTERPRETATION = "interpretation"


@dataclass(frozen=True)
class Finding:
    check: str  # the id in sdcp_fast.conform.statements.CHECKS
    section: str
    statement: str
    quote: str
    outcome: Outcome
    detail: str = ""
    times: int = 1


_RANK = {Outcome.FAIL: 3, Outcome.INTERPRETATION: 2, Outcome.PASS: 1, Outcome.UNREACHABLE: 0}


@dataclass
class Report:
    target: str
    role: str
    findings: list[Finding] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what the run assumed beyond the draft

    def add(self, check: str | Check, ok: bool | None | Outcome, detail: str = "") -> bool:
        """Record one exercise of ``check``: True pass, False fail, None not reachable, or an
        :class:`Outcome`; returns whether it passed. A check exercised again (each round's
        verdict) stays one line with its worst outcome (fail, interpretation, pass, not
        reachable: the first detail of that outcome is kept) and counts its exercises."""
        c = check if isinstance(check, Check) else CHECKS[check]
        outcome = ok if isinstance(ok, Outcome) else Outcome.UNREACHABLE if ok is None else \
            Outcome.PASS if ok else Outcome.FAIL
        for i, seen in enumerate(self.findings):
            if seen.check == c.id:
                keep = seen if _RANK[seen.outcome] >= _RANK[outcome] else \
                    Finding(c.id, c.section, c.statement, c.quote, outcome, detail)
                self.findings[i] = Finding(c.id, c.section, c.statement, c.quote, keep.outcome, keep.detail,
                                           seen.times + 1)
                return outcome is Outcome.PASS
        self.findings.append(Finding(c.id, c.section, c.statement, c.quote, outcome, detail))
        return outcome is Outcome.PASS

    def outcome(self, check: str) -> Outcome | None:
        for f in self.findings:
            if f.check == check:
                return f.outcome
        return None

    @property
    def failed(self) -> list[Finding]:
        return [f for f in self.findings if f.outcome is Outcome.FAIL]

    def counts(self) -> dict[str, int]:
        return {o.value: sum(f.outcome is o for f in self.findings) for o in Outcome}

    def text(self, quotes: bool = False) -> str:
        lines = [f"SDCP conformance of the {self.role} at {self.target}"]
        lines += [f"  note: {n}" for n in self.notes]
        marks = {Outcome.PASS: "pass", Outcome.FAIL: "FAIL", Outcome.UNREACHABLE: "n/r ",
                 Outcome.INTERPRETATION: "int "}
        for f in self.findings:
            times = f" [x{f.times}]" if f.times > 1 else ""
            lines.append(f"  {marks[f.outcome]}  §{f.section:<6} {f.statement}{times}"
                         + (f"  ({f.detail})" if f.detail else ""))
            if quotes:
                lines.append(f"          \"{f.quote}\"")
        c = self.counts()
        lines.append(f"{c['pass']} pass, {c['fail']} fail, {c['not reachable']} not reachable, "
                     f"{c['interpretation']} interpretation")
        return "\n".join(lines)

    def json(self) -> str:
        return json.dumps({"target": self.target, "role": self.role, "counts": self.counts(), "notes": self.notes,
                           "findings": [{**asdict(f), "outcome": f.outcome.value} for f in self.findings]}, indent=2)
