"""The kit passes a faithful verifier that chooses differently where the draft is silent
(tests/conform/variants.py), and reports those choices as interpretations."""

from __future__ import annotations

from typing import Any

from sdcp_fast.conform.report import Outcome

from .harness import run_kit
from .variants import PATCHES, different_choices


def test_a_faithful_verifier_with_other_choices_passes(tmp_path: Any) -> None:
    report = run_kit(str(tmp_path), wrap=different_choices, patches=PATCHES)
    assert not report.failed, report.text()
    interpreted = {f.check for f in report.findings if f.outcome is Outcome.INTERPRETATION}
    assert {"valid-contracts", "invalid-contracts", "unknown-action", "m-cap-restore", "rule2-q-zero",
            "rule2-temperature-0"} <= interpreted, report.text()
    # The 409's session-state was found under its other name and checked value by value.
    assert report.outcome("stale-state") is Outcome.PASS
    # Rule 2 refused did not stop the run: the checks after it ran.
    assert report.outcome("resume") is Outcome.PASS and report.outcome("ladder") is Outcome.PASS
