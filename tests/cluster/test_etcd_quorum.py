"""A router whose cluster's etcd has lost its quorum refuses new sessions at once: 503 in
OpenAI's error shape with Retry-After, instead of an open whose first append waits on etcd
(in process, on loopback: an etcd cluster of three members, one stopped and one killed)."""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from sdcp_fast.cluster.etcd_records import EtcdRecords
from sdcp_fast.deploy.up import free_port
from sdcp_fast.transport import loop
from tests.commitlog.mlc_etcd import running_etcd
from tests.roles.test_frontend import deployment, post

pytestmark = pytest.mark.services

PROMPT = "the verifier commits"


def health(port: int) -> str | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
            return str(json.loads(r.read())["health"])
    except urllib.error.HTTPError as exc:  # 503 {"health": "false"}
        return str(json.loads(exc.read())["health"])
    except OSError:
        return None


@contextlib.contextmanager
def quorum_lost() -> Iterator[list[tuple[str, int]]]:
    """A three-member etcd cluster on loopback that lost two members: one stopped (it takes
    connections and never answers) and one killed. The endpoints, the one left first."""
    binary = shutil.which("etcd")
    if binary is None:
        pytest.skip("etcd binary missing: scripts/services.sh installs Debian's etcd-server")
    clients, peers = [free_port() for _ in range(3)], [free_port() for _ in range(3)]
    data = tempfile.mkdtemp(prefix="sdcp-etcd-")
    initial = ",".join(f"m{i}=http://127.0.0.1:{p}" for i, p in enumerate(peers))
    procs = [subprocess.Popen(
        [binary, "--name", f"m{i}", "--data-dir", f"{data}/m{i}", "--listen-client-urls",
         f"http://127.0.0.1:{clients[i]}", "--advertise-client-urls", f"http://127.0.0.1:{clients[i]}",
         "--listen-peer-urls", f"http://127.0.0.1:{peers[i]}", "--initial-advertise-peer-urls",
         f"http://127.0.0.1:{peers[i]}", "--initial-cluster", initial, "--log-level", "error"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for i in range(3)]
    try:
        deadline = time.monotonic() + 60
        while any(health(port) != "true" for port in clients):
            assert all(p.poll() is None for p in procs) and time.monotonic() < deadline, "etcd did not form"
            time.sleep(0.2)
        procs[1].send_signal(signal.SIGSTOP)
        procs[2].kill()
        while health(clients[0]) != "false":  # it notices within an election timeout
            assert time.monotonic() < deadline, "the member left kept its leader"
            time.sleep(0.2)
        yield [("127.0.0.1", port) for port in clients]
    finally:
        for p in procs:
            p.kill()
            p.wait()
        shutil.rmtree(data, ignore_errors=True)


def complete(tmp_path: Path, records: EtcdRecords) -> tuple[int, dict[str, str], dict[str, object], float]:
    async def scenario() -> tuple[int, dict[str, str], dict[str, object], float]:
        async with deployment(tmp_path) as (d, _, _):
            d.router.durable = records.refusal
            began = time.monotonic()
            answer = await d.router.handler(post("v1/completions", {"model": "toy", "prompt": PROMPT}))
            return answer.status, dict(answer.headers), json.loads(answer.body), time.monotonic() - began

    return loop.run(scenario())


def test_without_an_etcd_quorum_a_new_session_is_503_at_once_and_with_one_it_opens(tmp_path: Path) -> None:
    with quorum_lost() as members:
        records = EtcdRecords("c1", members)
        try:
            status, headers, body, took = complete(tmp_path / "a", records)
        finally:
            records.close()
    assert status == 503, body
    assert headers["retry-after"] == "1"
    error = body["error"]
    assert isinstance(error, dict) and error["type"] == "server_error" and error["code"] == "sdcp-busy"
    assert "quorum" in error["message"]
    assert took < 10, f"the refusal took {took:.1f} s"
    with running_etcd() as member:
        records = EtcdRecords("c1", [member])
        try:
            status, _, body, _ = complete(tmp_path / "b", records)
        finally:
            records.close()
    assert status == 200, body
