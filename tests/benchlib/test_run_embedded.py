"""``sdcp-fast bench --embedded``: the bench starts ``sdcp-fast up`` itself with the first
drafter, the same fixed M and batch limit as the in-process row it sits next to, and measures
it through the front end (toy model, a few tokens)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sdcp_fast.cli import main

pytestmark = pytest.mark.services


def test_embedded_run_starts_up_with_the_configuration_and_prints_the_peers(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "embedded"
    assert main(["bench", "--embedded", "--model", "toy", "--drafters", "toy-good", "--no-variants", "--m", "3",
                 "--sessions", "2", "--prompts", "2", "--max-new", "4", "--repeats", "1", "--no-progress",
                 "--no-plots", "--out", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    assert [c["name"] for c in report["configs"]] == ["target-only", "toy-good", "up:toy-good"]
    assert report["configs"][2] == {"name": "up:toy-good", "path": "embedded", "drafter": "toy-good", "m": 3,
                                    "max_batch": 64}
    argv = report["embedded"]["services"]
    assert report["embedded"]["start_s"] > 0
    assert set(argv) == {"mlc", "router", "verifier", "verifier-standby", "drafter-a"}
    drafter, verifier = argv["drafter-a"], argv["verifier"]
    assert drafter[drafter.index("--m") + 1] == "3" and verifier[verifier.index("--max-batch") + 1] == "64"
    assert "--device" not in drafter + verifier  # cpu: the services' own default
    fig = report["summary"]["up:toy-good"]["2"]
    assert fig["tokens"] == 2 * 4 and not fig["problems"] and fig["rounds"] > 0
    printed = capsys.readouterr().out
    assert "peers side by side" in printed and "distribution: up:toy-good makes " in printed
