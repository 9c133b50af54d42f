"""Every example in docs/frontend.md, run as written against ``sdcp-fast up`` (the toy model,
to keep it cheap): the code blocks are read from the document, their placeholders (D, PORT,
KEY, MODEL, ROUTER_PORT, VERIFIER_PORT) filled from ``endpoints.json``, and each must succeed.
No example may name a model: the deployment's is whatever ``GET /v1/models`` lists."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from sdcp_fast.deploy.up import Up

from .conftest import toy_up

pytestmark = pytest.mark.services

DOC = Path(__file__).resolve().parents[2] / "docs" / "frontend.md"


def blocks() -> list[tuple[str, str]]:
    return re.findall(r"```(\w*)\n(.*?)```", DOC.read_text(), flags=re.S)


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory):
    with toy_up(tmp_path_factory.mktemp("docs"), timeout=300) as deployment:
        yield deployment


def filled(up: Up, code: str) -> str:
    e = up.endpoints()
    values = {"D": str(up.directory), "PORT": str(up.api_port), "KEY": e["api_key"], "MODEL": e["model"],
              "ROUTER_PORT": str(urlsplit(e["services"]["router"]["url"]).port),
              "VERIFIER_PORT": str(urlsplit(e["services"]["verifier"]["url"]).port)}
    return re.sub(r"\b(D(?=/)|PORT|KEY|MODEL|ROUTER_PORT|VERIFIER_PORT)\b", lambda m: values[m.group(1)], code)


def test_no_example_names_a_model() -> None:
    for _, code in blocks():
        assert not re.search(r"""model["']?\s*[=:]\s*["'](?!MODEL)""", code), code


def test_every_example_runs_against_the_deployment(up: Up) -> None:
    e = json.loads((up.directory / "endpoints.json").read_text())
    ran = []
    for language, code in blocks():
        code = filled(up, code)
        if language == "json":  # a part of endpoints.json
            shown = json.loads("{" + code + "}")
            assert set(shown) <= set(e), code
            continue
        if language == "python":
            done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
            assert done.returncode == 0 and done.stdout.strip(), (code, done.stdout, done.stderr)
            ran.append("python")
            continue
        assert language == "sh", language
        for line in code.splitlines():
            command = line.split("  #")[0].strip()
            if not command:
                continue
            program = command.split()[0]
            if program == "aiperf" and shutil.which("aiperf") is None:
                # Not installed here: what it needs of us is the tokenizer folder, checked below.
                continue
            if program == "python":
                command = command.replace("python", sys.executable, 1)
            if program == "sdcp-fast":
                command = command.replace("sdcp-fast", f"{sys.executable} -m sdcp_fast", 1)
            done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=300)
            assert done.returncode == 0 and done.stdout.strip(), (command, done.stdout, done.stderr)
            if program == "curl":
                assert json.loads(done.stdout)["choices"][0]["text"], done.stdout
            ran.append(program)
    assert {"python", "curl", "sdcp-fast"} <= set(ran), ran
    router_log = (up.directory / "logs" / "router.log").read_text()
    assert "never retrieved" not in router_log and "Traceback" not in router_log


def test_the_tokenizer_folder_loads_for_load_generators(up: Up) -> None:
    transformers = pytest.importorskip("transformers")
    tokenizer = transformers.AutoTokenizer.from_pretrained(up.endpoints()["tokenizer"])
    assert tokenizer.encode("the verifier commits", add_special_tokens=False)
