import json

import pytest

from sdcp_fast.cli import main


def test_demo_json_runs_sessions_to_the_end(capsys):
    assert main(["demo", "--inprocess", "--model", "toy", "--json", "--sessions", "3", "--max-new", "12"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert len(report["sessions"]) == 3
    assert all(s["chain_ok"] and s["finish"] == "finish" for s in report["sessions"])
    assert report["tokens_per_pass"] > 1
    assert all(report["baseline"]["identical_output"])
    # Target-only commits one token per session pass, whatever the sessions per pass.
    base = report["baseline"]
    assert base["tokens_per_session_pass"]["target_only"] == 1.0 < base["tokens_per_pass"]["target_only"]
    assert base["bound"] > 1 and abs(base["bound_from_costs"] - base["bound"] / base["pass_cost"]) < 0.02
    # Each session alone (B = 1): one interleaved pair per session by default, its spread beside it.
    alone = report["alone"]
    assert alone["repeats"] == 3 and all(alone["identical_output"])
    assert [p["session"] for p in alone["pairs"]] == [s["prompt"] for s in report["sessions"]]
    assert [p["first"] for p in alone["pairs"]] == ["speculative", "target-only", "speculative"]
    assert all(p["tokens"] == 12 for p in alone["pairs"])
    for side in ("speculative", "target_only"):
        rate = alone["tokens_per_s_per_session"][side]
        assert 0 < rate["min"] <= rate["median"] <= rate["max"]
    assert alone["speedup_min"] <= alone["speedup"] <= alone["speedup_max"]


def test_demo_prints_rounds_and_figures(capsys):
    assert main(["demo", "--inprocess", "--model", "toy", "--sessions", "2", "--max-new", "8", "--rule", "2"]) == 0
    out = capsys.readouterr().out
    assert "digest chain verified" in out and "tokens/s" in out and " r1 " in out and "speedup" in out
    assert "each session alone (B = 1" in out and "speedup at B = 1 " in out and "per-session tokens/s" in out


@pytest.mark.model
def test_demo_on_smollm2_equals_target_only_greedy_decoding(capsys):
    from sdcp_fast.model.loader import ModelNotFound, smollm2_path

    try:
        smollm2_path()
    except ModelNotFound as exc:
        pytest.skip(str(exc))
    assert main(["demo", "--inprocess", "--model", "smollm2", "--json", "--sessions", "2", "--max-new", "12",
                 "--drafters", "ngram"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert all(report["baseline"]["identical_output"])
    assert all(s["chain_ok"] for s in report["sessions"])


@pytest.mark.services
def test_demo_across_processes_streams_through_the_front_end(capsys):
    """The README's main job: sdcp-fast up, prompts through the front end, figures."""
    assert main(["demo", "--model", "toy", "--json", "--sessions", "3", "--max-new", "16"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["mode"] == "services" and len(report["sessions"]) == 3
    assert all(s["tokens"] == 16 and s["text"] for s in report["sessions"])
    assert report["tokens_per_pass"] > 1 and report["acceptance"] is not None
    assert all(report["baseline"]["identical_output"])
    assert report["alone"]["repeats"] == 3 and all(report["alone"]["identical_output"])


def test_unknown_model_is_a_clear_error(capsys):
    assert main(["demo", "--model", "/nonexistent/model.gguf"]) == 2
    assert "no model at" in capsys.readouterr().err


def test_help_lists_the_commands(capsys):
    try:
        main(["--help"])
    except SystemExit as exc:
        assert exc.code == 0
    assert "demo" in capsys.readouterr().out
