import json

from sdcp_fast.cli import main


def test_demo_json_runs_sessions_to_the_end(capsys):
    assert main(["demo", "--json", "--sessions", "3", "--max-new", "12"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert len(report["sessions"]) == 3
    assert all(s["chain_ok"] and s["finish"] in ("finish", "fail") for s in report["sessions"])
    assert report["tokens_per_pass"] > 1


def test_demo_prints_rounds_and_figures(capsys):
    assert main(["demo", "--sessions", "2", "--max-new", "8"]) == 0
    out = capsys.readouterr().out
    assert "digest chain verified" in out and "tokens/s" in out and " r1 " in out


def test_help_lists_the_commands(capsys):
    try:
        main(["--help"])
    except SystemExit as exc:
        assert exc.code == 0
    assert "demo" in capsys.readouterr().out
