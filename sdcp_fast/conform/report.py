"""What the conformance kit found: one line per normative statement it exercised."""

from __future__ import annotations

import enum
import json
from dataclasses import asdict, dataclass, field


class Outcome(enum.Enum):
    PASS = "pass"
    FAIL = "fail"
    UNREACHABLE = "not reachable from outside"


@dataclass(frozen=True)
class Finding:
    section: str  # the draft's section, e.g. "6.3"
    statement: str  # the normative statement, in short
    outcome: Outcome
    detail: str = ""


@dataclass
class Report:
    target: str
    role: str
    findings: list[Finding] = field(default_factory=list)
    _times: dict[int, int] = field(default_factory=dict, repr=False)

    def add(self, section: str, statement: str, ok: bool | None, detail: str = "") -> bool:
        """Record one statement: True pass, False fail, None not reachable; returns ``ok is True``.
        A statement exercised again (each round's verdict) stays one line: it fails if any
        exercise failed (the first failure's detail is kept), and counts its exercises."""
        outcome = Outcome.UNREACHABLE if ok is None else Outcome.PASS if ok else Outcome.FAIL
        for i, seen in enumerate(self.findings):
            if (seen.section, seen.statement) == (section, statement):
                times = self._times.get(i, 1) + 1
                self._times[i] = times
                keep = seen if seen.outcome is Outcome.FAIL or outcome is not Outcome.FAIL else \
                    Finding(section, statement, outcome, detail)
                base = keep.detail.split(" [x", 1)[0]
                self.findings[i] = Finding(section, statement, keep.outcome, f"{base} [x{times}]".strip())
                return ok is True
        self.findings.append(Finding(section, statement, outcome, detail))
        return ok is True

    @property
    def failed(self) -> list[Finding]:
        return [f for f in self.findings if f.outcome is Outcome.FAIL]

    def counts(self) -> dict[str, int]:
        return {o.value: sum(f.outcome is o for f in self.findings) for o in Outcome}

    def text(self) -> str:
        lines = [f"SDCP conformance of the {self.role} at {self.target}"]
        for f in self.findings:
            mark = {Outcome.PASS: "pass", Outcome.FAIL: "FAIL", Outcome.UNREACHABLE: "n/r "}[f.outcome]
            lines.append(f"  {mark}  §{f.section:<6} {f.statement}" + (f"  ({f.detail})" if f.detail else ""))
        c = self.counts()
        lines.append(f"{c['pass']} pass, {c['fail']} fail, {c['not reachable from outside']} not reachable from outside")
        return "\n".join(lines)

    def json(self) -> str:
        return json.dumps({"target": self.target, "role": self.role, "counts": self.counts(),
                           "findings": [{**asdict(f), "outcome": f.outcome.value} for f in self.findings]}, indent=2)
