"""roles/verifier_batch.py through the verifier's handler: when a batch closes (every session
that owes a proposal has sent it, ``max_batch`` rounds, or ``batch_wait`` seconds), one
scoring pass per batch, and a failed pass drops only its rounds (docs/interpretations.md,
"Verifier batching")."""

from __future__ import annotations

import asyncio
import time

import pytest

from sdcp_fast.protocol import SdcpProblem

from .rolekit import VERIFIER, Rig, contract, proposal, run, sid

SESSIONS = [sid(40 + i) for i in range(5)]


async def _open_all(rig: Rig, n: int) -> list:
    states = []
    for session in SESSIONS[:n]:
        _, state = await rig.open(session, contract(max_new=32), m_init=2)
        states.append(state)
    return states


async def _propose_all(rig: Rig, states: list) -> list:
    return await asyncio.gather(*(rig.drafter.propose(VERIFIER, proposal(s, rig.greedy_after(s, 2))) for s in states))


def test_a_batch_closes_when_every_session_owing_a_proposal_has_sent_it(tmp_path):
    """Three sessions, a long batch_wait: the third proposal closes the batch at once, and the
    three rounds are scored in one pass."""

    async def scenario():
        async with Rig(str(tmp_path), batch_wait=30.0) as rig:
            states = await _open_all(rig, 3)
            t0 = time.monotonic()
            verdicts = await _propose_all(rig, states)
            return verdicts, time.monotonic() - t0, rig.verifier.target_passes, [r.batch for r in rig.rounds]

    verdicts, seconds, passes, batches = run(scenario())
    assert [v.round for v in verdicts] == [1, 1, 1] and all(v.accepted == 2 for v in verdicts)
    assert passes == 1 and batches == [3, 3, 3] and seconds < 15.0


@pytest.mark.parametrize(("sessions", "max_batch", "sizes"), [(5, 2, [2, 2, 1]), (3, 1, [1, 1, 1]), (5, 64, [5])])
def test_max_batch_bounds_each_pass(tmp_path, sessions, max_batch, sizes):
    async def scenario():
        # Sessions whose round was committed owe the next proposal: batch_wait closes the last batch.
        async with Rig(str(tmp_path), batch_wait=0.2, max_batch=max_batch) as rig:
            states = await _open_all(rig, sessions)
            verdicts = await _propose_all(rig, states)
            return verdicts, rig.verifier.target_passes, [r.batch for r in rig.rounds]

    verdicts, passes, batches = run(scenario())
    assert len(verdicts) == sessions and passes == len(sizes)
    assert sorted(batches, reverse=True) == sorted((n for n in sizes for _ in range(n)), reverse=True)


def test_batch_wait_closes_a_batch_a_session_owes_a_proposal_to(tmp_path):
    """Two sessions owe proposals, one sends: its round waits batch_wait, then goes alone."""

    async def scenario():
        async with Rig(str(tmp_path), batch_wait=0.3) as rig:
            states = await _open_all(rig, 2)
            t0 = time.monotonic()
            verdict = await rig.drafter.propose(VERIFIER, proposal(states[0], rig.greedy_after(states[0], 2)))
            return verdict, time.monotonic() - t0, [r.batch for r in rig.rounds]

    verdict, seconds, batches = run(scenario())
    assert verdict.round == 1 and batches == [1] and seconds >= 0.25


def test_a_failed_pass_drops_its_rounds_and_the_next_pass_serves_them(tmp_path):
    """A scorer failure answers each round of the pass 500 sdcp-internal-error, commits
    nothing, and the drafters' retries are scored by the next pass."""

    async def scenario():
        async with Rig(str(tmp_path), batch_wait=30.0) as rig:
            states = await _open_all(rig, 3)

            def fail_once(batch):
                rig.scorer.on_score = None
                raise RuntimeError("device lost")

            rig.scorer.on_score = fail_once
            failed = await asyncio.gather(*(rig.drafter.propose(VERIFIER, proposal(s, rig.greedy_after(s, 2)))
                                            for s in states), return_exceptions=True)
            committed = [rig.verifier.sessions.get(s.session).committed for s in states]
            verdicts = await _propose_all(rig, states)
            return failed, committed, verdicts, rig.rounds

    failed, committed, verdicts, rounds = run(scenario())
    assert all(isinstance(f, SdcpProblem) and f.status == 500 for f in failed), failed
    assert all(f.received_type.endswith("sdcp-internal-error") for f in failed)  # not a type the draft lists
    assert committed == [0, 0, 0]
    assert [v.round for v in verdicts] == [1, 1, 1] and [r.batch for r in rounds] == [3, 3, 3]
