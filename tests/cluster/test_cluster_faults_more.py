"""More faults across three simulated hosts (the default layout, toy model, temperature 0), each
stream compared with target-only greedy decoding of its prompt, as in test_cluster_faults.py,
whose helpers these use. The tests share one cluster and run in this order: losing two etcd
members of three refuses new sessions at once and loses nothing committed; losing a session's
drafter's host leaves it to the other drafter or to its verifier (the host is started again
after); losing h1, the host of the router that serves a stream and of the Mooncake master, lets
the client resume at h2's front end with ``Last-Event-ID``."""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from sdcp_fast.cluster import simulate
from sdcp_fast.cluster.etcd_records import new_session, routed_sessions
from sdcp_fast.cluster.spec import ClusterSpec, load
from sdcp_fast.commitlog.etcd import EtcdCommitLog
from sdcp_fast.protocol.commitlog import CommitRecord, LogRecord
from sdcp_fast.protocol.routing import RoutedSession
from tests.cluster.test_cluster_faults import N, after, opened, stream
from tests.deploy.test_up import greedy_text

pytestmark = pytest.mark.services


def processes(directory: Path, host: str) -> dict[str, int]:
    """Role -> pid on ``host`` as its node last wrote them (a restarted process has a new pid)."""
    state = json.loads((directory / host / "node.json").read_text())
    return {p["role"]: p["pid"] for p in state["processes"]}


def request(directory: Path, frontend: int, prompt: str, *, stream: bool, last: str | None = None
            ) -> urllib.request.Request:
    endpoints = json.loads((directory / "endpoints.json").read_text())
    headers = {"Authorization": f"Bearer {endpoints['api_key']}", "Content-Type": "application/json"}
    if last is not None:
        headers["Last-Event-ID"] = last
    return urllib.request.Request(endpoints["frontends"][frontend] + "completions", data=json.dumps(
        {"model": "toy", "prompt": prompt, "max_tokens": N, "stream": stream, "temperature": 0}).encode(),
        headers=headers)


def events(response: Any) -> Iterator[tuple[str | None, str | None]]:
    """(event id, text) of each text event, then (None, None) for [DONE]; nothing more where the
    connection ends first."""
    ident = None
    for raw in response:
        line = raw.strip()
        if line.startswith(b"id: "):
            ident = line[4:].decode()
        elif line == b"data: [DONE]":
            yield None, None
            return
        elif line.startswith(b"data: "):
            yield ident, json.loads(line[6:])["choices"][0]["text"]


def log_of(spec: ClusterSpec, routed: RoutedSession) -> list[LogRecord]:
    """The session's commit log, read at the first etcd member that answers."""
    failure: Exception | None = None
    for address, _ in spec.etcd_clients():
        try:
            log = EtcdCommitLog.from_ref(routed.commit_log.replace("127.0.0.1", address))
        except OSError as exc:  # that member's host is down
            failure = exc
            continue
        try:
            return list(log.read().records)
        finally:
            log.close()
    raise AssertionError(f"no etcd member answered: {failure}")


def committed(records: list[LogRecord]) -> int:
    return max((r.committed for r in records if isinstance(r, CommitRecord)), default=0)


def etcd_health(spec: ClusterSpec, host: int = 0) -> str | None:
    address, port = spec.etcd_clients()[host]
    try:
        with urllib.request.urlopen(f"http://{address}:{port}/health", timeout=2) as r:
            return str(json.loads(r.read())["health"])
    except urllib.error.HTTPError as exc:
        return str(json.loads(exc.read())["health"])
    except OSError:
        return None


def wait(condition: Callable[[], bool], what: str, seconds: float = 90) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


def revive(directory: Path, spec: ClusterSpec, host: str) -> None:
    """Start ``host``'s node again, as ``cluster up`` did, once every process of its kill is
    gone; return when every router hears from every verifier and drafter again."""
    net = simulate.network(directory)
    wait(lambda: not net.pids(host), f"{host}'s processes outlived kill -9")
    (directory / host / "node.json").unlink(missing_ok=True)
    argv = net.exec_argv(host, [sys.executable, "-m", "sdcp_fast", "node", "--spec", str(directory / "cluster.toml"),
                                "--host", host, "--dir", str(directory), "--timeout", "150"])
    with open(directory / "logs" / f"node-{host}.log", "ab") as out:  # cluster down ends it with the namespace
        subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                         env={**os.environ, "PYTHONUNBUFFERED": "1"})
    wait(lambda: (directory / host / "node.json").exists(), f"{host}'s node did not come back", 150)
    simulate._wait_routers(spec, directory, time.monotonic() + 90)


def test_losing_two_etcd_members_refuses_new_sessions_at_once_and_loses_nothing(
        cluster: tuple[Path, ClusterSpec]) -> None:
    directory, spec = cluster
    prompt = "one member of three"
    text, routed = stream(directory, prompt, lambda _: None)
    assert text == greedy_text(prompt, N)
    done = after(spec, routed.session)
    before = log_of(spec, done)
    assert committed(before) == N
    # Stopped, not killed: a node starts a member that exited again, and a stopped member takes
    # connections and never answers, the worst a client can meet.
    stopped = [processes(directory, h.name)["etcd"] for h in spec.hosts[1:]]
    try:
        for pid in stopped:
            os.kill(pid, signal.SIGSTOP)
        wait(lambda: etcd_health(spec) == "false", "h1's member kept its leader", 30)
        began = time.monotonic()
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request(directory, 0, "the router verifies each epoch", stream=True), timeout=60)
        took = time.monotonic() - began
        body = json.loads(refused.value.read())
        assert refused.value.code == 503, body
        assert refused.value.headers["Retry-After"] == "1"
        assert set(body["error"]) >= {"message", "type", "code"} and "quorum" in body["error"]["message"]
        assert took < 10, f"the refusal took {took:.1f} s"
    finally:
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)
    wait(lambda: etcd_health(spec) == "true", "etcd did not get its quorum back")
    assert log_of(spec, done) == before
    prompt = "a drafter proposes many tokens"
    with opened(request(directory, 0, prompt, stream=False)) as r:
        assert json.loads(r.read())["choices"][0]["text"] == greedy_text(prompt, N)


def test_losing_a_drafter_s_host_leaves_the_session_to_the_other_drafter_or_its_verifier(
        cluster: tuple[Path, ClusterSpec]) -> None:
    directory, spec = cluster
    net = simulate.network(directory)
    killed: list[str] = []

    def kill_drafter_host(routed: RoutedSession) -> None:
        assert routed.drafter is not None, "the session had no drafter to lose"
        killed.append(spec.host_at(routed.drafter))
        net.kill(killed[0])

    prompt = "the router verifies each epoch"
    try:
        text, routed = stream_at(directory, 1, prompt, kill_drafter_host)
        assert text == greedy_text(prompt, N)
        moved = after(spec, routed.session)
        assert moved.drafter is None or spec.host_at(moved.drafter) != killed[0]
        assert committed(log_of(spec, moved)) == N
    finally:
        for host in killed:
            revive(directory, spec, host)


def test_losing_the_host_of_the_router_and_of_the_mooncake_master_the_client_resumes_at_the_other(
        cluster: tuple[Path, ClusterSpec]) -> None:
    directory, spec = cluster
    master = spec.mooncake_master()
    assert master is not None and master.host == "h1" and "router" in spec.host("h1").roles
    assert "mooncake-master" in processes(directory, "h1")
    net = simulate.network(directory)
    prompt = "a drafter proposes many tokens"
    text, routed = stream_at(directory, 0, prompt, lambda _: net.kill("h1"), resume_at=1)
    assert text == greedy_text(prompt, N)
    assert committed(log_of(spec, after(spec, routed.session))) == N


def stream_at(directory: Path, frontend: int, prompt: str, fault: Callable[[RoutedSession], None], *,
              resume_at: int | None = None) -> tuple[str, RoutedSession]:
    """A streamed completion through the front end ``frontend``, ``fault`` applied to its session
    once its first text came (test_cluster_faults.stream's way). With ``resume_at``, a stream
    that ends without [DONE] is resumed there with ``Last-Event-ID`` (the last id read). The
    whole text and the session as it was at the fault."""
    spec = load(directory / "cluster.toml")
    before = {r.session for r in routed_sessions(spec)}
    text: list[str] = []
    last, faulted, finished = None, None, False
    try:
        with opened(request(directory, frontend, prompt, stream=True)) as r:
            for ident, piece in events(r):
                if piece is None:
                    finished = True
                    break
                text.append(piece)
                last = ident or last
                if faulted is None and "".join(text):
                    faulted = new_session(spec, before)
                    fault(faulted)
    except (OSError, http.client.HTTPException):  # the front end's host died under the stream
        if resume_at is None:
            raise
    assert faulted is not None, "the stream ended before any text"
    if not finished and resume_at is not None:
        assert last is not None, "no event id to resume from"
        with opened(request(directory, resume_at, prompt, stream=True, last=last)) as r:
            rest = list(events(r))
        assert rest and rest[-1] == (None, None), "the resumed stream ended before [DONE]"
        text += [piece for _, piece in rest[:-1] if piece is not None]
        finished = True
    assert finished, "the stream ended before [DONE]"
    return "".join(text), faulted
