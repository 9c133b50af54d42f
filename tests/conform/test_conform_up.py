"""``sdcp-fast conform`` against our own deployment (``sdcp-fast up`` with the toy model):
every statement it can reach passes, and the report names those it cannot reach."""

from __future__ import annotations

import json

import pytest

from sdcp_fast.cli import main
from sdcp_fast.deploy.local import model_digest
from sdcp_fast.deploy.up import Up
from sdcp_fast.model.toy import ToyTarget


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory):
    deployment = Up(tmp_path_factory.mktemp("conform-up"), model="toy", status_ttl_ms=1500)
    try:
        deployment.start(timeout=120)
        yield deployment
    finally:
        deployment.stop()


def _conform(up: Up, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, dict]:
    e = up.endpoints()["services"]
    code = main(["conform", e["verifier"]["url"], "--certs", str(up.directory / "certs"), "--json",
                 "--mlc", e["mlc"]["url"], *extra])
    return code, json.loads(capsys.readouterr().out)


def test_our_verifier_passes_every_reachable_statement(up: Up, capsys: pytest.CaptureFixture[str]) -> None:
    code, report = _conform(up, capsys, "--target-digest", model_digest("toy-target").hex(),
                            "--vocab", str(ToyTarget().vocab_size))
    failed = [f for f in report["findings"] if f["outcome"] == "fail"]
    assert not failed and code == 0, failed
    sections = {f["section"] for f in report["findings"] if f["outcome"] == "pass"}
    assert {"4.1", "4.2", "5.1", "5.2", "6.1", "6.3", "6.4", "6.7"} <= sections
    assert report["counts"]["pass"] >= 25
    assert any(f["outcome"] == "not reachable from outside" for f in report["findings"])


def test_without_the_target_digest_only_refusals_are_checked(up: Up, capsys: pytest.CaptureFixture[str]) -> None:
    code, report = _conform(up, capsys)
    assert code == 0
    unreachable = [f for f in report["findings"] if f["outcome"] == "not reachable from outside"]
    assert any("target-digest" in f["statement"] for f in unreachable)


@pytest.mark.parametrize("role", ["drafter", "router"])
def test_other_roles_refuse_the_wrong_certificate(up: Up, capsys: pytest.CaptureFixture[str], role: str) -> None:
    e = up.endpoints()["services"]
    url = e["drafter-a" if role == "drafter" else "router"]["url"]
    code = main(["conform", url, "--certs", str(up.directory / "certs"), "--role", role, "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and report["counts"]["fail"] == 0, report
