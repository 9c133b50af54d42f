"""The bench harness end to end on the toy model: a short in-process run writes a valid
report.json (raw samples, environment, figures per configuration) and the plots, and
``--compare`` reads two reports. Speed is measured by the harness, never asserted here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sdcp_fast.cli import main

PNGS = ("throughput.png", "latency_cdf.png", "acceptance.png", "breakdown.png")


@pytest.fixture(scope="module")
def report_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("bench")
    assert main(["bench", "--model", "toy", "--inprocess", "--sessions", "1,2", "--prompts", "3", "--max-new", "6",
                 "--repeats", "2", "--alone", "2", "--no-progress", "--out", str(out)]) == 0
    return out


def test_report_holds_every_configuration_with_samples_and_environment(report_dir: Path) -> None:
    report = json.loads((report_dir / "report.json").read_text())
    assert report["schema"] == "sdcp-fast/bench/1"
    names = [c["name"] for c in report["configs"]]
    assert names[:3] == ["target-only", "toy-good", "toy-weak"]
    assert {"toy-good/adaptive-M", "toy-good/no-batching"} <= set(names)
    env = report["environment"]
    assert env["git"]["commit"] and env["versions"]["torch"] and env["cpu_count"]
    assert set(env["models"]) >= {"target", "tokenizer", "drafter:toy-good"}
    for name in names:
        # without batching one session in flight is the batched configuration: not run twice
        assert set(report["summary"][name]) == ({"2"} if name.endswith("/no-batching") else {"1", "2"})
        for fig in report["summary"][name].values():
            assert fig["repeats"] == 2 and fig["tokens"] == 2 * 3 * 6
            assert fig["tokens_per_s"]["median"] > 0 and fig["ttft_s"]["p50"] is not None
            assert not fig["problems"]
            assert fig["breakdown_s_per_round"]["scoring"] > 0
    assert report["summary"]["target-only"]["1"]["speedup"] == 1.0
    good = report["summary"]["toy-good"]["1"]
    assert good["acceptance"] > 0.3 and good["accepted_per_round"] > 0 and good["speedup_bound"] > 0
    assert report["summary"]["toy-good/no-batching"]["2"]["batch_sizes"] == {"1": pytest.approx(
        report["summary"]["toy-good/no-batching"]["2"]["target_passes"])}
    assert any(n.startswith("toy-good/no-batching is not run at 1 session") for n in report["notes"])
    # 2 levels x 2 repeats per configuration (no-batching: 1 level), every session with its arrival, output, rounds
    assert len(report["runs"]) == 4 * len(names) - 2
    for run in report["runs"]:
        assert len(run["samples"]) == 3 and run["wall"] > 0
        for s in run["samples"]:
            assert s["tokens"] == 6 and s["first"] >= s["arrived"] and s["finished"] >= s["first"]
            assert sum(n for _, n in s["chunks"]) == 6


def test_rule1_outputs_equal_target_only_in_every_configuration(report_dir: Path) -> None:
    report = json.loads((report_dir / "report.json").read_text())
    outputs: dict[str, list] = {}
    for run in report["runs"]:
        outputs.setdefault(run["config"], []).append([s["output"] for s in run["samples"]])
    reference = outputs["target-only"][0]
    for name, runs in outputs.items():
        assert all(r == reference for r in runs), name
    assert "rule 1: every in-process configuration's output is identical to target-only decoding" in report["notes"]
    assert all(f["same_as_target_only"] for n, levels in report["summary"].items() if n != "target-only"
               for f in levels.values())


def test_plots_are_pngs(report_dir: Path) -> None:
    for name in PNGS:
        assert (report_dir / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name


def test_compare_prints_the_differences(report_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = json.loads((report_dir / "report.json").read_text())
    fig = report["summary"]["toy-good"]["1"]
    fig["tokens_per_s"]["median"] *= 2
    del report["summary"]["toy-weak"]
    other = tmp_path / "b.json"
    other.write_text(json.dumps(report))
    capsys.readouterr()
    assert main(["bench", "--compare", str(report_dir / "report.json"), str(other)]) == 0
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.startswith("toy-good ") and "tokens/s" in ln and " 1 " in ln)
    assert line.split()[-1] == "2.00"
    assert "in one report only: toy-weak@1, toy-weak@2" in out


def test_compare_refuses_what_is_not_a_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "x.json"
    bad.write_text("{}")
    assert main(["bench", "--compare", str(bad), str(bad)]) == 2
    assert "not a bench report" in capsys.readouterr().err


def test_device_without_cuda_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: the refusal is for machines without one")
    assert main(["bench", "--model", "toy", "--device", "cuda"]) == 2
    assert "no CUDA device" in capsys.readouterr().err


def test_report_states_warmup_noise_and_why_the_hf_peer_was_skipped(report_dir: Path) -> None:
    report = json.loads((report_dir / "report.json").read_text())
    assert "not counted" in report["settings"]["warmup"]
    assert report["wall_s"] > 0 and report["environment"]["load_average_start"] is not None
    noise = next(n for n in report["notes"] if n.startswith("noise: "))
    assert "apart in tokens/s" in noise and "load average" in noise
    [hf] = [n for n in report["notes"] if n.startswith("HF assisted generation skipped: ")]
    assert "the toy target has no weights" in hf or "transformers is not installed" in hf
    assert not any(c["path"] == "hf" for c in report["configs"])


def test_peers_table_says_what_it_could_not_measure(report_dir: Path) -> None:
    from sdcp_fast.benchlib.bench_report import peers_table

    table = peers_table(json.loads((report_dir / "report.json").read_text()))
    rows = [ln.split()[0] for ln in table.splitlines()[2:]]
    assert rows[:2] == ["target-only", "toy-good"]
    assert "HF transformers: not measured (" in table


def test_open_loop_sessions_arrive_as_drawn_and_progress_is_shown(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    from sdcp_fast.benchlib.workload import Workload, builtin, take

    out = tmp_path / "rate"
    assert main(["bench", "--model", "toy", "--inprocess", "--drafters", "toy-good", "--no-variants", "--rate", "20",
                 "--sessions", "2", "--prompts", "4", "--max-new", "4", "--repeats", "1", "--no-plots",
                 "--alone", "0", "--out", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["alone"] == {}  # --alone 0: no session alone
    assert report["settings"]["rate"] == 20 and "open loop, Poisson 20.0/s" in report["settings"]["workload"]
    drawn = Workload(take(builtin(toy=True), 4), 4, rate=20).arrivals(4)
    for run in report["runs"]:
        arrived = [s["arrived"] for s in run["samples"]]
        # released at the drawn offsets (a little later: the event loop), TTFT counted from there
        assert all(d <= a < d + 0.5 for d, a in zip(drawn, arrived, strict=True)) and arrived[-1] > 0
        assert all(s["opened"] >= s["arrived"] and s["first"] >= s["opened"] for s in run["samples"])
    captured = capsys.readouterr()
    assert "toy-good @2" in captured.err  # the live display: configuration and level
    assert "toy-good @2: " in captured.out and " tok/s median of 1" in captured.out


def test_each_session_alone_pairs_every_drafter_with_target_only(report_dir: Path) -> None:
    from sdcp_fast.benchlib.bench_report import alone_table

    report = json.loads((report_dir / "report.json").read_text())
    assert set(report["alone"]) == {"toy-good", "toy-weak"}  # the fixed-M rows, not the variants
    for fig in report["alone"].values():
        # 3 prompts x 2 (--alone), one session each, the order swapped from one pair to the next
        assert fig["repeats"] == 6 and all(fig["identical_output"])
        assert [p["session"] for p in fig["pairs"]][:3] == ["0:toy", "1:toy", "2:toy"]
        assert [p["first"] for p in fig["pairs"]][:2] == ["speculative", "target-only"]
        assert all(p["tokens"] == 6 for p in fig["pairs"])
        for side in ("speculative", "target_only"):
            rate = fig["tokens_per_s_per_session"][side]
            assert 0 < rate["min"] <= rate["median"] <= rate["max"]
        assert fig["speedup_min"] <= fig["speedup"] <= fig["speedup_max"]
    table = alone_table(report)
    assert table.startswith("each session alone (B = 1") and "beside the speedup at 2 sessions in flight" in table
    row = next(ln for ln in table.splitlines() if ln.startswith("toy-good "))
    assert row.split()[1] == "6" and row.split()[-1] == "yes"


def test_compare_prints_the_b1_figures(report_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = json.loads((report_dir / "report.json").read_text())
    report["alone"]["toy-good"]["speedup"] *= 2
    other = tmp_path / "b.json"
    other.write_text(json.dumps(report))
    capsys.readouterr()
    assert main(["bench", "--compare", str(report_dir / "report.json"), str(other)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert next(ln for ln in lines if ln.startswith("toy-good ") and "B=1 speedup" in ln).split()[-1] == "2.00"
    assert next(ln for ln in lines if ln.startswith("toy-weak ") and "B=1 tok/s" in ln).split()[-1] == "1.00"
