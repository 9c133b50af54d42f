"""bench/cpu.py's smallest run in CI, on a shipped float checkpoint: every section reports,
and an absent peer (llama.cpp for a non-GGUF model; transformers when it is not installed)
is named with the reason it was skipped. Speed itself is never asserted."""

from __future__ import annotations

import importlib.util
import json
import time
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "cpu.py"


def _bench():
    spec = importlib.util.spec_from_file_location("bench_cpu", BENCH)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_smallest_run_reports_every_section_and_why_peers_were_skipped(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    bench = _bench()
    out = tmp_path / "cpu.json"
    assert bench.main(["--model", "tiny-target", "--weights", "q8_0,f32", "--threads", "1", "--repeats", "1",
                       "--tokens", "4", "--prefill", "16", "--skip-hf", "--drafters", "ngram", "--spec-prompts", "1",
                       "--out", str(out)]) == 0
    text = capsys.readouterr().out
    got = json.loads(out.read_text())
    assert set(got["decode"]["1"]) == {"ours q8_0", "ours f32"}
    assert set(got["decode_cpu_ms"]["1"]) == {"ours q8_0", "ours f32"}
    assert all(ms > 0 for v in got["decode_cpu_ms"]["1"].values() for ms in v)
    # What the machine did meanwhile: other processes' share of the cores, our preemptions.
    assert set(got["decode_preempted"]["1"]) == {"ours q8_0", "ours f32"}
    if Path("/proc/self/task").exists():  # each thread's share, the main thread's at least
        assert set(got["decode_threads_ms"]["1"]) == {"ours q8_0", "ours f32"}
        assert "CPU ms per token by thread" in text
    if Path("/proc/stat").exists():
        assert all(0 <= pct <= 100 for v in got["decode_others_pct"]["1"].values() for pct in v)
    assert len(got["load_average_end"]) == 3
    assert set(got["pass_ratio"]["1"]) == {"ours q8_0", "ours f32"} and got["speculation"]["q8_0"]["ngram"]
    assert any(n.startswith("llama.cpp skipped: ") for n in got["notes"])
    assert "HF transformers skipped: --skip-hf" in got["notes"]
    assert "decode tokens/s" in text and "decode CPU ms per token" in text and "note: llama.cpp skipped" in text
    assert "involuntary context switches per token" in text and "at the end)" in text
    assert len(got["speculation_by_prompt"]["q8_0"]["ngram"]) == len(got["spec_prompts"]) == 1
    assert "each prompt alone (one session):" in text


def test_agreement_counts_up_to_the_first_difference() -> None:
    bench = _bench()
    assert bench.agreement([[1, 2, 3], [4, 5, 6]], [[1, 2, 9], [4, 5, 6]]) == (5, 6)
    assert bench.agreement([[1]], [[2]]) == (0, 1)


def test_agree_only_without_llama_cpp_says_why(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bench = _bench()
    out = tmp_path / "agree.json"
    assert bench.main(["--model", "tiny-target", "--weights", "f32", "--agree-only", "--out", str(out)]) == 0
    got = json.loads(out.read_text())
    assert got["decode"] == {} and got["agreement"] == {} and got["speculation"] == {}
    assert any(n.startswith("llama.cpp skipped: ") for n in got["notes"])
    assert "decode tokens/s" not in capsys.readouterr().out


class _Stub:
    """A contender that answers each prompt with a fixed continuation."""

    def __init__(self, answers: dict[tuple[int, ...], list[int]]) -> None:
        self.answers = answers

    def encode(self, text: str) -> list[int]:
        return [ord(c) for c in text]

    def greedy(self, prompt: list[int], n: int) -> tuple[list[int], float]:
        return self.answers[tuple(prompt)][:n], 1.0


def test_agreement_mode_reports_each_prompts_prefix() -> None:
    bench = _bench()
    a, b = (97,), (98,)
    llama = _Stub({a: [1, 2, 3, 4], b: [5, 6, 7, 8]})
    ours = _Stub({a: [1, 2, 3, 4], b: [5, 9, 7, 8]})
    exact = _Stub({a: [1, 2, 0, 0], b: [5, 6, 7, 8]})
    got = bench.agree({"q4": ours}, llama, ["a", "b"], 4, exact=exact)
    assert got["ours q4"] == {"same": 5, "total": 8, "prompts": 2, "identical": 1, "prefix": [4, 1]}
    assert got["ours q4 vs llama.cpp with an f32 KV cache"]["prefix"] == [2, 1]
    assert got["llama.cpp with an f32 KV cache, no flash attention"]["prefix"] == [2, 4]


@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None and importlib.util.find_spec("llama_cpp_py_sync") is None,
                    reason="llama.cpp is an optional peer and neither binding is installed")
def test_llama_cpp_verification_pass_leaves_its_cache_at_the_context() -> None:
    from sdcp_fast.model import loader

    path = loader.resolve("smollm2")
    if path.suffix != ".gguf":
        pytest.skip(f"no shipped GGUF here ({path})")
    llama = _bench().LlamaCpp(path, 1)
    try:
        llama.prime([1, 2, 3, 4])
        for n in (1, 5, 2):
            assert llama.pass_s([5] * n) > 0
            assert llama.c.lib.llama_memory_seq_pos_max(llama.memory, 0) == 3
        assert llama.pass_ratio([1, 2, 3, 4, 5], reps=2) > 0
        assert llama.c.lib.llama_memory_seq_pos_max(llama.memory, 0) == 3
    finally:
        llama.close()


def test_decode_cpu_is_the_steady_states_where_the_contender_marks_it() -> None:
    """What a call costs once (for ours the deployment's start, the digests, the prompt's pass)
    is left out of CPU ms per token; a contender without the mark gets the whole call's."""
    bench = _bench()

    class Marked:
        steady_ms = 0.25

    dec: dict[str, list[float]] = {}
    cpu: dict[str, list[float]] = {}
    prof: dict[str, dict[str, list[float]]] = {}

    def run() -> tuple[list[int], float]:
        t = time.process_time()
        while time.process_time() - t < 0.05:  # a start-up's worth of CPU in the call
            pass
        return [1, 2, 3, 4], 10.0

    bench._timed(dec, cpu, prof, "marked", Marked(), run)
    bench._timed(dec, cpu, prof, "whole", object(), run)
    assert cpu["marked"] == [0.25]
    assert cpu["whole"][0] >= 50 / 4


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="per-thread CPU is read from /proc")
def test_per_thread_cpu_names_the_thread_that_spent_it() -> None:
    """A Python thread that burns CPU between two readings shows under its own name; the
    main thread, which waited, shows little."""
    import threading

    bench = _bench()
    burnt, done = threading.Event(), threading.Event()

    def burn() -> None:
        t = time.thread_time()
        while time.thread_time() - t < 0.2:
            pass
        burnt.set()
        done.wait(30)  # alive while it is read: an ended thread leaves /proc

    before = bench.thread_ticks()
    worker = threading.Thread(target=burn, name="burner")
    worker.start()
    try:
        assert burnt.wait(60)
        got = bench.per_thread_ms(before, bench.thread_ticks(), 10)
    finally:
        done.set()
        worker.join(30)
    assert got["burner"] >= 10  # 200 ms over 10 tokens, within a tick or two
    assert got.get("main", 0.0) < got["burner"]


def test_the_ratios_to_llama_cpp_are_of_tokens_per_second_and_of_cpu_per_token() -> None:
    bench = _bench()
    r = {"decode": {1: {"ours q4": [120.0], "llama.cpp": [80.0]}},
         "decode_cpu_ms": {1: {"ours q4": [8.0], "llama.cpp": [10.0]}},
         "pass_ratio": {1: {}}, "prefill_s": {1: {}}}
    lines = bench._timing_lines(r, [1])
    assert "  vs llama.cpp at 1 thread(s), tokens/s: ours q4 1.50x; CPU per token ours q4 0.80x" in lines
