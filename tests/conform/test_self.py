"""Self-tests of the kit: for each check, a verifier wrong on purpose that the check must
report as a failure (tests/conform/faults.py), and our verifier, which none fails.

Each run is our verifier in process on the toy target (harness.py), with only the parts of
the kit the fault concerns, so the whole file runs in seconds.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from sdcp_fast.conform.report import Outcome
from sdcp_fast.conform.statements import CHECKS, OTHER_ROLES
from sdcp_fast.model.toy import ToyTarget

from .faultkit import Fault
from .faults import FAULTS, NEVER_FAIL, NOT_IN_PROCESS
from .harness import patched, run_kit


def _kit_kw(fault: Fault, tmp_path: Any) -> dict[str, Any]:
    kw = dict(fault.kit)
    if kw.get("vectors") == "bad":
        from sdcp_fast.conform.checker import default_vectors

        src = default_vectors()
        assert src is not None
        bad = tmp_path / "vectors"
        bad.mkdir()
        for name in ("contracts.json", "prefix.json"):
            data = json.loads(open(f"{src}/{name}").read())
            if name == "prefix.json":
                data["chains"][0]["d"][-1] = "00" * 32
            (bad / name).write_text(json.dumps(data))
        kw["vectors"] = str(bad)
    return kw


@pytest.mark.parametrize("fault", FAULTS, ids=[f.name for f in FAULTS])
def test_each_fault_is_caught_by_its_check(fault: Fault, tmp_path: Any) -> None:
    report = run_kit(str(tmp_path / "store"), wrap=fault.wrap, patches=fault.patches, groups=fault.groups,
                     scorer=fault.scorer, kit_kw=_kit_kw(fault, tmp_path))
    missed = [c for c in fault.catches if report.outcome(c) is not Outcome.FAIL]
    assert not missed, (missed, report.text())


def test_every_check_has_a_fault_that_it_catches() -> None:
    caught = {c for fault in FAULTS for c in fault.catches}
    assert caught <= set(CHECKS)
    assert set(CHECKS) - OTHER_ROLES - caught == NEVER_FAIL | NOT_IN_PROCESS  # OTHER_ROLES: test_other_roles.py


def test_a_should_not_followed_is_an_interpretation_not_a_failure(tmp_path: Any) -> None:
    """§6.5.1 "It SHOULD restore m_cap gradually": a verifier that never does is reported
    as an interpretation."""
    from sdcp_fast.protocol.control import SpeculationControl

    after_round = SpeculationControl.after_round

    def no_restore(self: SpeculationControl, accepted: int, proposed: int, load: int) -> Any:
        before = self.m_cap
        decision = after_round(self, accepted, proposed, load)
        if decision.m_cap > before:
            self.m_cap = before
            return type(decision)(decision.action, before, decision.low)
        return decision

    report = run_kit(str(tmp_path), patches=[(SpeculationControl, "after_round", no_restore)], groups=("ladder",))
    assert report.outcome("m-cap-restore") is Outcome.INTERPRETATION
    assert not report.failed, report.text()


def test_our_verifier_in_process_passes_every_check(tmp_path: Any) -> None:
    report = run_kit(str(tmp_path))
    assert not report.failed, report.text()
    reached = {f.check for f in report.findings if f.outcome is not Outcome.UNREACHABLE}
    assert reached == set(CHECKS) - NOT_IN_PROCESS - OTHER_ROLES
    assert report.counts()["interpretation"] == 0, report.text()


def test_the_harness_puts_patches_back() -> None:
    with patched([(ToyTarget, "vocab_size", 3)]):
        assert ToyTarget.vocab_size == 3
    assert ToyTarget.vocab_size != 3
