"""Where a service's drafts run (offload=True): a model whose drafts take microseconds drafts on
the event loop's thread, where a hop to the drafting thread would cost more than the draft; a
slow model stays on the drafting thread, so the loop serves meanwhile; the model is never
called from two threads at once."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from sdcp_fast.model.interfaces import Draft

from .rolekit import DRAFTER, PROMPT, VERIFIER, Rig, assignment, contract, greedy, run, sid, until


class Scripted:
    """Drafts the next M tokens of ``script`` (the output after the prompt) at no cost,
    recording each call's thread and how many calls overlapped; call n (from 1) sleeps
    ``seconds`` first where ``slow(n)`` holds."""

    name = "scripted"

    def __init__(self, seconds: float = 0.0, slow: Callable[[int], bool] = lambda n: True,
                 busy: float = 0.0) -> None:
        self.seconds, self.slow, self.busy = seconds, slow, busy  # busy: seconds of CPU each call spends
        self.script: list[int] = []
        self.threads: list[int] = []
        self.running = self.most = 0
        self._lock = threading.Lock()

    def propose(self, session: bytes, committed: Any, m: int, **_: Any) -> Draft:
        with self._lock:
            self.threads.append(threading.get_ident())
            n = len(self.threads)
            self.running += 1
            self.most = max(self.most, self.running)
        try:
            if self.seconds and self.slow(n):
                time.sleep(self.seconds)
            spin_until = time.perf_counter() + self.busy
            while time.perf_counter() < spin_until:
                pass
            done = len(committed) - len(PROMPT)
            return Draft([*self.script[done:done + m], *[0] * m][:m], None)
        finally:
            with self._lock:
                self.running -= 1

    def release(self, session: bytes) -> None:
        return None


def drafting(tmp_path, model: Scripted, sessions: int, max_new: int):
    """Run ``sessions`` sessions through a service-like drafter role: the loop thread's id,
    the role, each session's output and the target's greedy output."""

    async def scenario():
        async with Rig(str(tmp_path)) as rig:
            expected = greedy(rig.target, PROMPT, max_new)
            model.script = expected  # every proposal accepted: no fallback to the verifier's own decoding
            role = await rig.drafter_role(model, offload=True, fixed_m=3)
            ids = [sid(40 + i) for i in range(sessions)]
            for s in ids:
                opened, state = await rig.open(s, contract(max_new=max_new), drafter=None)
                a = assignment(opened, state)
                confirmed = await rig.router.put_drafter(VERIFIER, a)
                await rig.router.assign(DRAFTER, replace(a, round=confirmed.round, committed=confirmed.committed,
                                                         digest=confirmed.digest))
            await until(lambda: all(rig.verifier.sessions.get(s).closed for s in ids), seconds=60.0)
            return threading.get_ident(), role, [rig.output_of(s) for s in ids], expected

    return run(scenario(), timeout=90.0)


def test_a_cheap_model_drafts_on_the_loop_thread(tmp_path) -> None:
    model = Scripted()
    loop, role, outputs, expected = drafting(tmp_path, model, sessions=1, max_new=96)
    assert outputs == [expected]  # rule 1: the output is the target's, whatever is proposed (§6.4)
    # The first drafts go to the drafting thread until the model's cost is known.
    assert model.threads[0] != loop
    assert loop in model.threads
    # Drafting inline, nothing is prepared during the round: drafting after the verdict costs as little.
    assert role.speculation["prepared"] < len(model.threads) // 2


def test_a_draft_cheaper_than_a_hop_to_the_drafting_thread_stays_on_the_loop_thread(tmp_path) -> None:
    """Drafts of some 30 us of CPU (a cheap model on a busy host) cost less than the hop that
    would move them: they run on the loop's thread."""
    model = Scripted(busy=30e-6)
    loop, role, outputs, expected = drafting(tmp_path, model, sessions=1, max_new=96)
    assert outputs == [expected]
    assert sum(thread == loop for thread in model.threads) > len(model.threads) // 2


def test_a_slow_model_drafts_off_the_loop_thread_and_prepares_ahead(tmp_path) -> None:
    model = Scripted(seconds=0.003)
    loop, role, outputs, expected = drafting(tmp_path, model, sessions=1, max_new=10)
    assert outputs == [expected]
    assert model.threads and loop not in model.threads
    assert role.speculation["prepared"] > 0


def test_the_model_is_called_from_one_thread_at_a_time(tmp_path) -> None:
    """Two slow drafts in a row send the next ones to the drafting thread (one alone is taken
    for a hiccup); inline drafting resumes only once every draft handed over is back."""
    model = Scripted(seconds=0.002, slow=lambda n: n % 40 in (0, 1))
    loop, role, outputs, expected = drafting(tmp_path, model, sessions=4, max_new=120)
    assert outputs == [expected] * 4
    assert model.most == 1
    assert loop in model.threads and len(set(model.threads)) == 2
    second = [i for i in range(40, len(model.threads) - 1, 40)]  # call n = i + 1, n % 40 == 1
    assert second and all(model.threads[i + 1] != loop for i in second)
