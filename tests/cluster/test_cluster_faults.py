"""Faults across three simulated hosts (the default layout, toy model, temperature 0), each
stream compared with target-only greedy decoding of its prompt (what an uninterrupted run
gives). The tests share one cluster and run in this order, each leaving it serving:
losing one etcd member mid-stream changes nothing; cutting off the active verifier's host
makes the router fence and fail over, and the old verifier commits nothing after the fence
(its etcd log); kill -9 of every process of the active verifier's host moves the session
to the other verifier's host; and one stream survives both, one after the other. Streams go
through h1's front end (h1 holds no verifier)."""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sdcp_fast.cluster import simulate
from sdcp_fast.cluster.etcd_records import new_session, routed_sessions
from sdcp_fast.cluster.spec import ClusterSpec, load
from sdcp_fast.commitlog.etcd import EtcdCommitLog, EtcdError
from sdcp_fast.protocol.commitlog import CommitRecord, FenceRecord
from sdcp_fast.protocol.routing import RoutedSession
from tests.deploy.test_up import greedy_text

pytestmark = pytest.mark.services

N = 160  # tokens per stream: long enough that a fault lands while it runs


def stream(directory: Path, prompt: str, fault: Callable[[RoutedSession], None],
           max_tokens: int = N) -> tuple[str, RoutedSession]:
    """A streamed completion of ``prompt`` through h1's front end; once its first text came,
    ``fault`` is applied to its session (as etcd's routing record holds it). The whole text
    and the session as it was when the fault came."""
    endpoints = json.loads((directory / "endpoints.json").read_text())
    spec = load(directory / "cluster.toml")
    before = {r.session for r in routed_sessions(spec)}
    request = urllib.request.Request(endpoints["frontends"][0] + "completions", data=json.dumps(
        {"model": "toy", "prompt": prompt, "max_tokens": max_tokens, "stream": True, "temperature": 0}).encode(), headers={
        "Authorization": f"Bearer {endpoints['api_key']}", "Content-Type": "application/json"})
    text, faulted = [], None
    with opened(request) as r:
        for line in r:
            line = line.strip()
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            text.append(json.loads(line[6:])["choices"][0]["text"])
            if faulted is None and "".join(text):
                faulted = new_session(spec, before)
                fault(faulted)
    assert faulted is not None, "the stream ended before any text"
    return "".join(text), faulted


def opened(request: urllib.request.Request) -> Any:
    """The response to ``request``, asked again while the front end answers 503: a router
    takes verifiers from the registry within a second or two of their registration."""
    deadline = time.monotonic() + 60
    while True:
        try:
            return urllib.request.urlopen(request, timeout=240)
        except urllib.error.HTTPError as exc:
            if exc.code != 503 or time.monotonic() > deadline:
                raise
        time.sleep(0.5)


def after(spec: ClusterSpec, session: bytes) -> RoutedSession:
    return next(s for s in routed_sessions(spec) if s.session == session)


def test_losing_one_etcd_member_mid_stream_changes_nothing(cluster: tuple[Path, ClusterSpec]) -> None:
    directory, spec = cluster
    state = json.loads((directory / "cluster.json").read_text())

    def kill_member(routed: RoutedSession) -> None:  # the member on the active verifier's host
        host = spec.host_at(routed.verifier)
        [pid] = [p["pid"] for h in state["hosts"] if h["name"] == host for p in h["processes"] if p["role"] == "etcd"]
        os.kill(pid, signal.SIGKILL)

    prompt = "one member of three"
    text, routed = stream(directory, prompt, kill_member)
    assert text == greedy_text(prompt, N)
    assert after(spec, routed.session).epoch == routed.epoch  # no fail-over was needed


def test_a_cut_off_verifier_host_is_fenced_and_commits_nothing_after_the_fence(cluster: tuple[Path, ClusterSpec]) -> None:
    directory, spec = cluster
    net = simulate.network(directory)
    cut: list[str] = []

    def cut_off(routed: RoutedSession) -> None:
        cut.append(spec.host_at(routed.verifier))
        net.cut_off(cut[0])

    prompt = "the router verifies each epoch"
    try:
        text, routed = stream(directory, prompt, cut_off)
        moved = after(spec, routed.session)
        log = EtcdCommitLog.from_ref(moved.commit_log.replace("127.0.0.1", spec.hosts[0].address))
        try:
            records = log.read().records
        finally:
            log.close()
    finally:
        for host in cut:
            net.restore(host)
    assert text == greedy_text(prompt, N)
    assert moved.epoch > routed.epoch and spec.host_at(moved.verifier) != cut[0]
    fence = next(i for i, r in enumerate(records) if isinstance(r, FenceRecord) and r.epoch == moved.epoch)
    assert not any(isinstance(r, CommitRecord) and r.epoch < moved.epoch for r in records[fence:]), \
        "the old verifier committed after the fence"


def test_kill_9_of_the_active_verifier_s_host_moves_the_session(cluster: tuple[Path, ClusterSpec]) -> None:
    directory, spec = cluster
    net = simulate.network(directory)
    # The host cut off before is back: wait until its verifier is registered again.
    from sdcp_fast.cluster.membership_etcd import Membership

    deadline = time.monotonic() + 90
    while True:
        m = Membership(spec.token, spec.etcd_clients())
        try:
            verifiers = {x.host for x in m.members("verifier")}
        finally:
            m.close()
        if len(verifiers) == 2:
            break
        assert time.monotonic() < deadline, f"verifiers registered: {sorted(verifiers)}"
        time.sleep(0.5)
    killed: list[str] = []

    def kill_host(routed: RoutedSession) -> None:
        killed.append(spec.host_at(routed.verifier))
        net.kill(killed[0])

    prompt = "a drafter proposes many tokens"
    text, routed = stream(directory, prompt, kill_host)
    assert text == greedy_text(prompt, N)
    moved = after(spec, routed.session)
    assert moved.epoch > routed.epoch and spec.host_at(moved.verifier) != killed[0]


def test_a_stream_survives_its_verifier_s_host_killed_then_the_next_one_cut_off(
        cluster: tuple[Path, ClusterSpec]) -> None:
    """One stream, two faults: kill -9 of the active verifier's host moves the session to the
    other verifier's host, which is then cut off. With it, two of the three etcd members are
    gone, so nothing commits until the killed host's node is started again: its etcd member
    rejoins from its data, its verifier registers, and the router fails the session over to
    it. The text equals an uninterrupted run's."""
    import threading

    directory, spec = cluster
    net = simulate.network(directory)
    for host in spec.hosts:  # a host the test before killed starts again
        if not net.pids(host.name):
            simulate.restart(directory, host.name)
    order: list[tuple[str, int]] = []  # (the session's verifier host, epoch) after each move
    cut: list[str] = []
    failed: list[BaseException] = []

    def moved_from(session: bytes, host: str, epoch: int, deadline: float) -> RoutedSession:
        while True:
            try:
                now = after(spec, session)
            except (OSError, EtcdError):
                now = None  # no quorum while two members are away: ask again
            if now is not None and now.epoch > epoch and spec.host_at(now.verifier) != host:
                return now
            assert time.monotonic() < deadline, f"the session never left {host} (epoch {epoch})"
            time.sleep(0.05)

    def chain(routed: RoutedSession) -> None:
        try:
            first = spec.host_at(routed.verifier)
            net.kill(first)
            moved = moved_from(routed.session, first, routed.epoch, time.monotonic() + 120)
            order.append((spec.host_at(moved.verifier), moved.epoch))
            cut.append(order[0][0])
            net.cut_off(cut[0])
            simulate.restart(directory, first, wait_routers=False)
            back = moved_from(routed.session, cut[0], moved.epoch, time.monotonic() + 180)
            order.append((spec.host_at(back.verifier), back.epoch))
        except BaseException as exc:  # noqa: BLE001 - the test asserts on it
            failed.append(exc)
        finally:
            for host in cut:
                net.restore(host)

    threads: list[threading.Thread] = []

    def start_chain(routed: RoutedSession) -> None:
        threads.append(threading.Thread(target=chain, args=(routed,), daemon=True))
        threads[0].start()

    prompt = "every session is verified twice"
    text, routed = stream(directory, prompt, start_chain, max_tokens=400)
    threads[0].join(240)
    assert not failed, failed
    assert text == greedy_text(prompt, 400)
    first = spec.host_at(routed.verifier)
    assert [h for h, _ in order] == [cut[0], first], order
    assert order[0][1] > routed.epoch and order[1][1] > order[0][1]
