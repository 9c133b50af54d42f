"""``sdcp-fast conform`` against our own deployment (``sdcp-fast up`` with the toy model), over
the network: every check it reaches passes, none is an interpretation, and the report names
those it cannot reach (one deployment for the module)."""

from __future__ import annotations

import json

import pytest

from sdcp_fast.cli import main
from sdcp_fast.conform.statements import CHECKS, OTHER_ROLES
from sdcp_fast.deploy.local import model_digest
from sdcp_fast.deploy.up import Up
from sdcp_fast.model.toy import ToyTarget
from tests.deploy.conftest import toy_up

# Statements no client can reach from outside our deployment (docs/conformance.md says why).
UNREACHABLE = {"events", "m-cap-load"}


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory):
    with toy_up(tmp_path_factory.mktemp("conform-up")) as deployment:
        yield deployment


def _conform(up: Up, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, dict]:
    e = up.endpoints()["services"]
    code = main(["conform", e["verifier"]["url"], "--certs", str(up.directory / "certs"), "--json", *extra])
    return code, json.loads(capsys.readouterr().out)


def test_our_verifier_passes_every_reachable_check(up: Up, capsys: pytest.CaptureFixture[str]) -> None:
    e = up.endpoints()["services"]
    code, report = _conform(up, capsys, "--target-digest", model_digest("toy-target").hex(),
                            "--vocab", str(ToyTarget().vocab_size), "--mlc", e["mlc"]["url"],
                            "--oracle", "sdcp_fast.conform.oracles:toy")
    outcomes = {f["check"]: f["outcome"] for f in report["findings"]}
    assert code == 0 and "fail" not in outcomes.values(), [f for f in report["findings"] if f["outcome"] == "fail"]
    assert "interpretation" not in outcomes.values(), report
    assert {c for c, o in outcomes.items() if o == "not reachable"} == UNREACHABLE
    assert set(outcomes) == set(CHECKS) - OTHER_ROLES
    assert all(f["quote"] for f in report["findings"])


def test_without_the_target_digest_only_refusals_are_checked(up: Up, capsys: pytest.CaptureFixture[str]) -> None:
    code, report = _conform(up, capsys, "--only", "auth", "--only", "contracts", "--only", "session")
    assert code == 0
    outcomes = {f["check"]: f["outcome"] for f in report["findings"]}
    assert outcomes["wrong-target"] == "pass" and outcomes["open-state"] == "not reachable"


@pytest.mark.parametrize("role", ["drafter", "router"])
def test_other_roles_refuse_the_wrong_certificate(up: Up, capsys: pytest.CaptureFixture[str], role: str) -> None:
    e = up.endpoints()["services"]
    url = e["drafter-a" if role == "drafter" else "router"]["url"]
    code = main(["conform", url, "--certs", str(up.directory / "certs"), "--role", role, "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and report["counts"]["fail"] == 0 and report["counts"]["interpretation"] == 0, report
