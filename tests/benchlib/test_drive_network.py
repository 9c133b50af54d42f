"""The bench harness against a deployment it did not start: ``Up`` with the toy model, then
``sdcp-fast bench --router URL`` with the client certificate and the verifiers' metrics."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sdcp_fast.cli import main
from sdcp_fast.deploy.up import Up
from tests.deploy.conftest import toy_up

pytestmark = pytest.mark.services


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory):
    with toy_up(tmp_path_factory.mktemp("up"), drafters=("toy-good",)) as deployment:
        yield deployment


def test_remote_run_measures_the_deployment_through_its_front_end(up: Up, tmp_path: Path) -> None:
    e = up.endpoints()
    verifiers = [s.uri for s in up.services.values() if s.role == "verifier"]
    out = tmp_path / "remote"
    assert main(["bench", "--router", up.services["router"].uri, "--ca", e["ca"], "--cert", e["client_cert"],
                 "--key", e["client_key"], *(a for v in verifiers for a in ("--metrics", v)), "--sessions", "2",
                 "--prompts", "3", "--max-new", "6", "--repeats", "1", "--no-progress", "--out", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    assert [c["name"] for c in report["configs"]] == ["remote"]
    fig = report["summary"]["remote"]["2"]
    assert fig["tokens"] == 3 * 6 and not fig["problems"]
    assert fig["ttft_s"]["p50"] > 0 and fig["tokens_per_s"]["median"] > 0
    # rounds and acceptance come from the verifiers' own counters, read before and after
    assert fig["rounds"] > 0 and fig["acceptance"] is not None and fig["target_passes"] > 0
    assert fig["breakdown_s_per_round"]["verifier"] > 0
    # the batch-size distribution from the verifiers' histogram, at its resolution
    assert sum(fig["batch_sizes"].values()) == fig["target_passes"] and all(k.startswith("<=") for k in fig["batch_sizes"])
    assert any("no target-only figure" in n for n in report["notes"])
    [run] = report["runs"]
    assert all(s["finish"] == "length" and isinstance(s["output"], str) and s["output"] for s in run["samples"])
    assert (out / "throughput.png").is_file()


def test_remote_run_needs_the_client_certificate(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--router", "https://127.0.0.1:1/"]) == 2
    assert "--ca, --cert and --key" in capsys.readouterr().err


def test_remote_run_with_the_model_here_measures_target_only_beside_it(up: Up, tmp_path: Path) -> None:
    e = up.endpoints()
    out = tmp_path / "remote-baseline"
    assert main(["bench", "--router", up.services["router"].uri, "--ca", e["ca"], "--cert", e["client_cert"],
                 "--key", e["client_key"], "--model", "toy", "--sessions", "2", "--prompts", "2", "--max-new", "4",
                 "--repeats", "1", "--no-progress", "--no-plots", "--out", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    assert [c["name"] for c in report["configs"]] == ["target-only", "remote"]
    assert report["summary"]["remote"]["2"]["speedup"] > 0
    assert not (out / "throughput.png").exists()
