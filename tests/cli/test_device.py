"""``--device`` on the commands that load a model: parsed the same way everywhere, CPU by
default, and a clear error where the machine has no CUDA device."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from sdcp_fast.cli import build_parser, main
from sdcp_fast.deploy.catalog import check_device, load_target

COMMANDS = {
    "generate": ["--prompt", "hi"],
    "demo": [],
    "verifier": [],
    "drafter": [],
}
no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error of a machine without CUDA")


@pytest.mark.parametrize("command", COMMANDS)
def test_device_defaults_to_cpu_and_takes_cuda(command: str) -> None:
    parser = build_parser()
    assert parser.parse_args([command, *COMMANDS[command]]).device == "cpu"
    assert parser.parse_args([command, *COMMANDS[command], "--device", "cuda"]).device == "cuda"
    assert parser.parse_args([command, *COMMANDS[command], "--device", "cuda:1"]).device == "cuda:1"


def test_check_device() -> None:
    assert check_device("cpu") == "cpu"
    for bad in ("tpu", "gpu", "cuda:x"):
        with pytest.raises(ValueError, match="expected cpu, cuda or cuda:N"):
            check_device(bad)


@no_cuda
def test_no_cuda_device_here() -> None:
    with pytest.raises(ValueError, match="no CUDA device here"):
        check_device("cuda")
    with pytest.raises(ValueError, match="no CUDA device here"):
        load_target("tiny-target", "cuda")


def test_the_toy_target_stays_on_the_cpu() -> None:
    assert load_target("toy", "cpu").name == "toy"
    if torch.cuda.is_available():
        with pytest.raises(ValueError, match="toy target has no weights"):
            load_target("toy", "cuda")


@no_cuda
@pytest.mark.parametrize("argv", [
    ["generate", "--model", "tiny-target", "--prompt", "hi", "--max-new", "2"],
    ["demo", "--inprocess", "--model", "tiny-target", "--drafters", "ngram", "--sessions", "1", "--max-new", "2"],
    ["demo", "--model", "tiny-target", "--drafters", "ngram", "--sessions", "1", "--max-new", "2"],
    ["verifier", "--model", "tiny-target", "--insecure"],
    ["drafter", "--model", "tiny-target", "--insecure"],
], ids=["generate", "demo-inprocess", "demo-services", "verifier", "drafter"])
def test_commands_refuse_cuda_without_a_device(argv: list[str], capsys) -> None:
    assert main([*argv, "--device", "cuda"]) == 2
    assert "--device cuda: no CUDA device here" in capsys.readouterr().err


def bench_model():
    path = Path(__file__).parents[2] / "bench" / "model.py"
    spec = importlib.util.spec_from_file_location("bench_model", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("bench_model", module)
    spec.loader.exec_module(module)
    return module


@no_cuda
@pytest.mark.parametrize("synthetic", [[], ["--synthetic", "tiny-target"]], ids=["preset", "synthetic"])
def test_bench_model_refuses_cuda_without_a_device(synthetic: list[str], capsys, tmp_path: Path) -> None:
    argv = ["--device", "cuda", "--model", "tiny-target", "--out", str(tmp_path), *synthetic]
    assert bench_model().main(argv) == 2
    assert "no CUDA device here" in capsys.readouterr().err


def test_bench_model_synthetic_runs_on_the_cpu(tmp_path: Path) -> None:
    import json

    argv = ["--synthetic", "tiny-target", "--batches", "1,2", "--steps", "1", "--prompt-len", "8", "--threads", "1",
            "--out", str(tmp_path)]
    assert bench_model().main(argv) == 0
    report = json.loads((tmp_path / "runner-tiny-target-cpu-sdpa.json").read_text())
    assert report["device"] == "cpu" and [r["batch"] for r in report["rows"]] == [1, 2]
    assert all(r["eager_decode_ms"] > 0 and r["eager_verify_ms"] > 0 for r in report["rows"])


def test_generate_runs_on_the_cpu_by_default(capsys) -> None:
    assert main(["generate", "--model", "tiny-target", "--prompt", "The word", "--max-new", "4", "--raw",
                 "--drafter", "model:tiny-draft", "--json"]) == 0
    assert '"tokens"' in capsys.readouterr().out


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="runs the commands on a CUDA device")


def _generate(capsys, *extra: str) -> list[int]:
    import json

    argv = ["generate", "--model", "tiny-target", "--prompt", "The word", "--raw", "--max-new", "12", "--json",
            "--device", "cuda", *extra]
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)["tokens"]


@needs_cuda
@pytest.mark.gpu
def test_generate_on_cuda_rule1_equals_greedy_decoding(capsys) -> None:
    greedy = _generate(capsys, "--drafter", "none")
    assert _generate(capsys, "--drafter", "model:tiny-draft") == greedy
    assert _generate(capsys, "--drafter", "layerskip:2") == greedy


@needs_cuda
@pytest.mark.gpu
def test_generate_on_cuda_rule2_is_seeded(capsys) -> None:
    args = ("--drafter", "model:tiny-draft", "--rule", "2", "--temperature", "0.8", "--seed", "3")
    assert _generate(capsys, *args) == _generate(capsys, *args)


@needs_cuda
@pytest.mark.gpu
def test_demo_inprocess_on_cuda_equals_target_only(capsys) -> None:
    import json

    assert main(["demo", "--inprocess", "--model", "tiny-target", "--drafters", "ngram,model:tiny-draft",
                 "--sessions", "2", "--max-new", "12", "--json", "--device", "cuda"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert all(report["baseline"]["identical_output"]) and all(s["chain_ok"] for s in report["sessions"])
