"""Starting ``sdcp-fast up`` where a start is slow: ``--timeout``, each role logging where its
start is, the front end's admission options reaching the routers, and the served model's
tokenizer written for load generators (deploy/up.py, cli/up.py, deploy/service.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sdcp_fast.deploy.up import Up
from sdcp_fast.roles.frontend_text import HFTokenizer, ToyWords, save_tokenizer


def _value(argv: list[str], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv else None


def test_admission_options_reach_every_router_and_the_first_writes_the_tokenizer(tmp_path: Path) -> None:
    up = Up(tmp_path, model="toy", routers=2, max_inflight_per_key=3, max_inflight=7, max_queue=11)
    up.plan()
    for name in ("router", "router-2"):
        argv = up.services[name].argv
        assert (_value(argv, "--api-per-key"), _value(argv, "--api-max-inflight"), _value(argv, "--api-queue")) \
            == ("3", "7", "11")
    assert _value(up.services["router"].argv, "--api-tokenizer-dir") == str(tmp_path / "tokenizer")
    assert "--api-tokenizer-dir" not in up.services["router-2"].argv
    assert up.endpoints()["tokenizer"] == str(tmp_path / "tokenizer")
    default = Up(tmp_path / "default", model="toy")
    default.plan()
    assert "--api-per-key" not in default.services["router"].argv  # the router's own default


def test_up_takes_a_timeout_and_says_where_each_pending_service_is(tmp_path: Path) -> None:
    began = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "sdcp_fast", "up", "--model", "toy", "--dir", str(tmp_path),
                           "--timeout", "1"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    assert "after 1s" in done.stderr or "within 1s" in done.stderr, done.stderr
    assert "last lines" in done.stderr or "within 1s" in done.stderr, done.stderr
    assert time.monotonic() - began < 100


def test_a_role_logs_each_step_of_its_start(tmp_path: Path) -> None:
    """Loading, building kernels, listening: a slow start shows which step it is in."""
    process = subprocess.Popen(
        [sys.executable, "-m", "sdcp_fast", "verifier", "--model", "toy", "--insecure", "--listen", "127.0.0.1:0",
         "--uri", "http://127.0.0.1:1/", "--mlc", "http://127.0.0.1:1", "--router", "http://127.0.0.1:1/"],
        stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    try:
        assert process.stderr is not None
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            line = process.stderr.readline()
            if not line:
                break
            lines.append(line)
            if "listening on" in line or "serving" in line:
                break
    finally:
        process.terminate()
        process.wait(30)
    steps = [next((i for i, line in enumerate(lines) if word in line), None)
             for word in ("loading", "building kernels", "loaded in", "listening on")]
    assert None not in steps and steps == sorted(steps), "".join(lines)


def test_the_toy_tokenizer_folder_loads_with_autotokenizer_and_gives_the_same_ids(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    folder = save_tokenizer(ToyWords(), tmp_path / "tokenizer", context=8192)
    loaded = transformers.AutoTokenizer.from_pretrained(str(folder))
    text = "the verifier commits the draft"
    assert loaded.encode("the verifier commits", add_special_tokens=False) == ToyWords().encode("the verifier commits")
    assert len(loaded.encode(text, add_special_tokens=False)) == len(text.split())
    assert json.loads((folder / "tokenizer_config.json").read_text())["model_max_length"] == 8192


def test_a_checkpoint_tokenizer_folder_keeps_its_ids_and_chat_template(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, "hello": 1, "world": 2, "<|im_start|>": 3, "<|im_end|>": 4}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens([AddedToken("<|im_start|>", special=True), AddedToken("<|im_end|>", special=True)])
    ours = HFTokenizer(tok)
    loaded = transformers.AutoTokenizer.from_pretrained(str(save_tokenizer(ours, tmp_path / "t")))
    assert loaded.encode("hello world", add_special_tokens=False) == ours.encode("hello world")
    assert loaded.eos_token == "<|im_end|>"
    chat = loaded.apply_chat_template([{"role": "user", "content": "hello"}], tokenize=False,
                                      add_generation_prompt=True)
    assert chat == ours.chat([{"role": "user", "content": "hello"}])
