"""SDCP across processes: ``sdcp-fast up`` (six processes on loopback, HTTP/2 + TLS 1.3 with
client certificates) serving completions through the router's front end (its own port: plain
HTTP with an API key, the official ``openai`` client, a client that disconnects), and a
verifier killed with -9 in the middle of a stream (§5.1, §6.7, §6.9)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from sdcp_fast.deploy.local import Engine, model_digest
from sdcp_fast.deploy.up import Up
from sdcp_fast.model.toy import ToyTarget, encode
from sdcp_fast.roles.router import SessionSpec
from sdcp_fast.roles.sse import DONE, messages

from .conftest import toy_up

pytestmark = pytest.mark.services


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory):
    with toy_up(tmp_path_factory.mktemp("up")) as deployment:
        yield deployment


def greedy_text(prompt: str, n: int) -> str:
    """Target-only greedy decoding of the toy target, in process (rule 1's reference, §6.4)."""
    from sdcp_fast.model.toy import decode
    from sdcp_fast.store import embedded

    target = ToyTarget()
    with embedded() as store:
        engine = Engine(target, [], store, target_digest=model_digest("t"), tokenizer_digest=model_digest("w"))
        [result] = engine.run([SessionSpec(encode(prompt), max_new=n, self_load=100, self_max=None)])
    return decode(result.tokens)


def curl(up: Up, path: str, body: dict, *extra: str) -> subprocess.CompletedProcess[str]:
    e = up.endpoints()
    return subprocess.run(
        ["curl", "-sS", "-H", f"Authorization: Bearer {e['api_key']}", "-d", json.dumps(body), *extra,
         e["frontend"] + path], capture_output=True, text=True, timeout=60)


def alpn(up: Up, name: str) -> str | None:
    """The protocol the service negotiates with the client certificate."""
    e = up.endpoints()
    ctx = ssl.create_default_context(cafile=e["ca"])
    ctx.load_cert_chain(e["client_cert"], e["client_key"])
    ctx.set_alpn_protocols(["h2", "http/1.1"])
    with socket.create_connection(("127.0.0.1", up.services[name].port), timeout=10) as raw, \
            ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
        return tls.selected_alpn_protocol()


def test_every_service_is_up_and_endpoints_are_written(up: Up) -> None:
    e = json.loads((up.directory / "endpoints.json").read_text())
    assert set(e["services"]) == {"mlc", "router", "verifier", "verifier-standby", "drafter-a", "drafter-b"}
    assert all(s["pid"] and s["url"].startswith("https://127.0.0.1:") for s in e["services"].values())
    assert Path(e["ca"]).is_file() and Path(e["client_cert"]).is_file() and e["frontend"].endswith("/v1/")
    assert e["frontend"].startswith("http://127.0.0.1:") and e["api_key"]


def test_http2_is_negotiated_with_a_client_certificate(up: Up) -> None:
    """§5.1: HTTP/2 over TLS 1.3 with mutual authentication."""
    for name in ("router", "verifier", "verifier-standby", "drafter-a", "drafter-b"):
        assert alpn(up, name) == "h2"


def test_a_client_without_a_certificate_is_refused_at_the_tls_layer(up: Up) -> None:
    e = up.endpoints()
    ctx = ssl.create_default_context(cafile=e["ca"])
    ctx.set_alpn_protocols(["h2"])
    port = up.services["verifier"].port
    with pytest.raises((ssl.SSLError, ConnectionError, OSError)):  # noqa: PT012
        with socket.create_connection(("127.0.0.1", port)) as raw, \
                ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            tls.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
            if not tls.recv(1):
                raise ConnectionError("closed")


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_rule1_completion_across_processes_equals_target_only_greedy_decoding(up: Up) -> None:
    """§6.4 rule 1 through router, verifier and drafters in separate processes, checked with
    an outside HTTP/2 client."""
    out = curl(up, "completions", {"model": "toy", "prompt": "the verifier commits", "max_tokens": 20})
    assert out.returncode == 0, out.stderr
    body = json.loads(out.stdout)
    assert body["choices"][0]["text"].split() == greedy_text("the verifier commits", 20).split()
    assert body["usage"]["completion_tokens"] == 20


def test_the_plain_openai_client_streams_a_completion_and_a_chat_and_a_wrong_key_is_401(up: Up) -> None:
    """The front end's own port: the official client with nothing but base_url and api_key."""
    openai = pytest.importorskip("openai", reason="the openai client is in the dev extra")
    e = up.endpoints()
    client = openai.OpenAI(base_url=e["frontend"], api_key=e["api_key"])
    stream = client.completions.create(model="toy", prompt="the verifier commits", max_tokens=20, stream=True)
    text = "".join(c.choices[0].text for c in stream if c.choices)
    chat = client.chat.completions.create(model="toy", messages=[{"role": "user", "content": "the verifier commits"}],
                                          max_tokens=20, stream=True)
    said = "".join(c.choices[0].delta.content or "" for c in chat if c.choices)
    assert text.split() == said.split() == greedy_text("the verifier commits", 20).split()
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=e["frontend"], api_key="sk-wrong", max_retries=0).models.list()


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_a_too_long_prompt_and_deep_json_are_400_in_openai_shape(up: Up) -> None:
    e = up.endpoints()
    out = curl(up, "completions", {"model": "toy", "prompt": "the " * 10_000}, "-w", "\n%{http_code}")
    body, status = out.stdout.rsplit("\n", 1)
    assert status == "400" and json.loads(body)["error"]["code"] == "context_length_exceeded"
    deep = subprocess.run(["curl", "-sS", "-w", "\n%{http_code}", "-H", f"Authorization: Bearer {e['api_key']}",
                           "-d", "[" * 3000 + "]" * 3000, e["frontend"] + "completions"],
                          capture_output=True, text=True, timeout=60)
    body, status = deep.stdout.rsplit("\n", 1)
    assert status == "400" and json.loads(body)["error"]["message"]


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_a_client_that_disconnects_ends_its_session_at_the_verifier(up: Up) -> None:
    """curl --max-time 1 on a 4000-token stream: the router cancels the session (DELETE
    sessions/{id}); the verifier logs it, well before the 4000th token."""
    e = up.endpoints()
    body = {"model": "toy", "prompt": "every session is", "max_tokens": 4000, "stream": True}
    out = curl(up, "completions", body, "-N", "--max-time", "1")
    first = next(line for line in out.stdout.splitlines() if line.startswith("data: {"))
    session = json.loads(first[6:])["id"].split("-", 1)[1]
    deadline = time.monotonic() + 20
    cancelled: list[str] = []
    while not cancelled and time.monotonic() < deadline:
        for log_file in Path(e["logs"]).glob("verifier*.log"):
            cancelled += [line for line in log_file.read_text().splitlines()
                          if f"session {session}: cancelled by the router" in line]
        time.sleep(0.2)
    assert cancelled, "no verifier logged the cancel"
    assert int(cancelled[0].split(" at ")[1].split()[0]) < 4000


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_kill_9_of_the_active_verifier_mid_stream_leaves_the_text_unchanged(up: Up) -> None:
    """§6.9: the router fences, fails over to the standby, and the front end's stream goes on
    by output index: nothing repeated, nothing missing; ``up`` restarts the dead process."""
    n = 400
    expected = greedy_text("every session is", n).split()
    e = up.endpoints()
    proc = subprocess.Popen(
        ["curl", "-sS", "-N", "-H", f"Authorization: Bearer {e['api_key']}",
         "-d", json.dumps({"model": "toy", "prompt": "every session is", "max_tokens": n, "stream": True}),
         e["frontend"] + "completions"], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    pieces: list[str] = []
    killed: list[str] = []

    def kill_active() -> None:
        for name in ("verifier", "verifier-standby"):
            metrics = subprocess.run(
                ["curl", "-sS", "--http2", "--cacert", e["ca"], "--cert", e["client_cert"], "--key",
                 e["client_key"], up.services[name].uri + "metrics"], capture_output=True, text=True, timeout=10)
            rounds = [line for line in metrics.stdout.splitlines() if line.startswith("sdcp_rounds_total")]
            if rounds and float(rounds[0].split()[-1]) > 0:
                process = up.services[name].process
                assert process is not None
                os.kill(process.pid, signal.SIGKILL)
                killed.append(name)
                return

    killer = threading.Thread(target=kill_active)

    async def curl_output() -> AsyncIterator[bytes]:
        assert proc.stdout is not None
        for line in proc.stdout:
            yield line.encode()

    async def read() -> None:
        async for message in messages(curl_output()):
            if message == DONE:
                continue
            pieces.append(message["choices"][0]["text"])
            if len(pieces) == 3:
                killer.start()

    asyncio.run(read())
    proc.wait(timeout=60)
    assert killer.ident is not None, "the stream ended before its third piece"
    killer.join()
    assert killed, "no verifier had committed rounds"
    assert "".join(pieces).split() == expected
    deadline = time.monotonic() + 30
    while not up.supervise_once() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert up.services[killed[0]].restarts == 1
