"""``sdcp-fast up --routers 2``: two routers over the same routing records, each with its own
SDCP and client-facing port. A router killed with -9 in the middle of a stream: the client
sends the same request to the other router with ``Last-Event-ID`` and gets the rest, the text
identical to target-only greedy decoding (rule 1, §6.4); ``up`` restarts the dead router."""

from __future__ import annotations

import http.client
import json
import os
import signal
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest

from sdcp_fast.deploy.up import Up
from sdcp_fast.roles.sse import DONE
from tests.deploy.test_up import greedy_text

pytestmark = pytest.mark.services

PROMPT = "every session is"


@pytest.fixture(scope="module")
def up2(tmp_path_factory: pytest.TempPathFactory):
    deployment = Up(tmp_path_factory.mktemp("up2"), model="toy", status_ttl_ms=1500, routers=2)
    try:
        deployment.start(timeout=120)
        yield deployment
    finally:
        deployment.stop()


def stream(base: str, key: str, body: dict[str, Any], last: str | None = None) -> Iterator[tuple[str | None, Any]]:
    """(id, message) of each event of a streamed completion, as an EventSource-style client reads
    them; ends quietly when the connection breaks."""
    url = urlsplit(base)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=60)
    headers = {"authorization": f"Bearer {key}", "content-type": "application/json"}
    if last is not None:
        headers["last-event-id"] = last
    try:
        conn.request("POST", url.path + "completions", json.dumps(body), headers)
        response = conn.getresponse()
        assert response.status == 200, response.read()
        ident, data = None, []
        while True:
            try:
                line = response.readline()
            except (http.client.HTTPException, OSError):
                return
            if not line:
                return
            line = line.rstrip(b"\r\n").decode()
            if line.startswith("id:"):
                ident = line[3:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].strip())
            elif not line and data:
                text = "\n".join(data)
                yield ident, DONE if text == DONE else json.loads(text)
                ident, data = None, []
    finally:
        conn.close()


def test_endpoints_list_both_routers_and_their_front_ends(up2: Up) -> None:
    e = json.loads((up2.directory / "endpoints.json").read_text())
    assert len(e["frontends"]) == 2 and e["frontend"] == e["frontends"][0]
    assert {name for name, s in e["services"].items() if s["role"] == "router"} == {"router", "router-2"}


def test_kill_9_of_a_router_mid_stream_the_client_resumes_at_the_other(up2: Up) -> None:
    n = 400
    e = up2.endpoints()
    body = {"model": "toy", "prompt": PROMPT, "max_tokens": n, "stream": True}
    pieces: list[str] = []
    last = None
    router = up2.services["router"].process
    assert router is not None
    for ident, message in stream(e["frontends"][0], e["api_key"], body):
        if message == DONE or not message["choices"][0]["text"]:
            continue
        pieces.append(message["choices"][0]["text"])
        last = ident
        if len(pieces) == 3:
            os.kill(router.pid, signal.SIGKILL)
    assert len(pieces) >= 3 and last is not None, "the stream ended before its third piece"
    assert router.wait(10) == -signal.SIGKILL
    before = len(pieces)
    rest = list(stream(e["frontends"][1], e["api_key"], body, last=last))
    assert rest[-1] == (None, DONE) and rest[-2][0] == last.split(":")[0] + ":end"
    pieces += [m["choices"][0]["text"] for _, m in rest if m != DONE and m.get("choices")]
    assert len(pieces) > before
    assert "".join(pieces).split() == greedy_text(PROMPT, n).split()
    deadline = time.monotonic() + 30
    while not up2.supervise_once() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert up2.services["router"].restarts == 1
