"""A verifier that restarted (kill -9) is sent the session-open it held again, by the router's
watchdog probe or an adoption (§6.1: the open is idempotent), with the round the open names:
0, or the resume read at the fail-over. Its rounds of that epoch are in the log already, and
§6.8 says its next record follows the last one it wrote: the open is refused
(``sdcp-stale-epoch``), nothing is appended, and the router's fail-over at the next epoch
resumes from the log's last record. (Found by tests/faults under CPU load: "round 69 after 70
rounds", the restarted verifier re-opened at the resume of round 68 appended round 69 again,
at the same epoch, after its own round 70.)"""

from __future__ import annotations

from dataclasses import replace

import pytest

from sdcp_fast.cache import object_uri
from sdcp_fast.protocol import Resume, SdcpProblem, SessionOpen, SessionState, Verdict
from sdcp_fast.protocol.commitlog import CommitRecord, FenceRecord, LogRecord

from .rolekit import SCOPE, VERIFIER, Rig, assignment, contract, proposal, run, sid

S = sid(91)
LOG = object_uri(SCOPE, S, "commit_log")


def log_of(rig: Rig) -> list[LogRecord]:
    return list(rig.store.logs.log(LOG).read().records)


async def rounds(rig: Rig, state: SessionState | Verdict, n: int) -> SessionState | Verdict:
    for _ in range(n):
        state = await rig.drafter.propose(VERIFIER, proposal(state, rig.greedy_after(state, 2)))
    return state


async def fail_over(rig: Rig, opened: SessionOpen, epoch: int) -> tuple[SessionOpen, SessionState]:
    """What the router does (§6.9): fence at ``epoch``, read the last commit record, open with
    it as the resume, assign the drafter."""
    rig.store.logs.log(LOG).append(FenceRecord(epoch), None)
    last = [r for r in log_of(rig) if isinstance(r, CommitRecord)][-1]
    resumed = replace(opened, epoch=epoch, resume=Resume(
        round=last.round, committed=last.committed, digest=last.digest,
        committed_tokens=object_uri(SCOPE, S, "committed_tokens", last.epoch)))
    state = await rig.router.open_session(VERIFIER, resumed)
    state = await rig.router.put_drafter(VERIFIER, assignment(resumed, state))
    return resumed, state


def audit(records: list[LogRecord]) -> list[tuple[int, int]]:
    """(epoch, round) of each commit record, checking §6.8's shape: each round once and in order."""
    commits = [(r.epoch, r.round) for r in records if isinstance(r, CommitRecord)]
    assert [n for _, n in commits] == list(range(1, len(commits) + 1)), commits
    return commits


@pytest.mark.parametrize("epoch", [1, 2], ids=["first-open", "resumed"])
def test_a_restarted_verifier_refuses_the_open_it_held_once_its_epoch_has_rounds(tmp_path, epoch):
    async def scenario():
        async with Rig(str(tmp_path)) as rig:
            opened, state = await rig.open(S, contract(max_new=30), m_init=2)
            state = await rounds(rig, state, 1)
            if epoch == 2:
                opened, state = await fail_over(rig, opened, 2)
            await rounds(rig, state, 2)  # this epoch's rounds, then the verifier is killed
            before = log_of(rig)
        async with Rig(str(tmp_path)) as rig:  # restarted: it knows no session
            with pytest.raises(SdcpProblem) as refused:
                await rig.router.open_session(VERIFIER, opened)
            with pytest.raises(SdcpProblem) as output:
                await rig.router.output(VERIFIER, S, 0)
            unchanged = log_of(rig)
            # The router's fail-over: the next epoch resumes from the log's last record.
            _, state = await fail_over(rig, opened, epoch + 1)
            await rounds(rig, state, 2)
            return refused.value, output.value, before, unchanged, log_of(rig)

    refused, output, before, unchanged, after = run(scenario(), timeout=60)
    assert (refused.suffix, refused.status) == ("sdcp-stale-epoch", 409)
    assert output.suffix == "sdcp-unknown-session"  # its output reader fails it over
    assert unchanged == before
    commits = audit(after)
    assert [e for e, _ in commits] == [1] * (3 if epoch == 1 else 1) + [2] * (0 if epoch == 1 else 2) + [epoch + 1] * 2


def test_a_restarted_verifier_whose_epoch_has_no_round_yet_resumes_where_the_open_says(tmp_path):
    """Killed after the fail-over's open and before its first commit: the log's last commit is
    the resume's, so the open it held is still the right start."""

    async def scenario():
        async with Rig(str(tmp_path)) as rig:
            opened, state = await rig.open(S, contract(max_new=30), m_init=2)
            state = await rounds(rig, state, 2)
            resumed, _ = await fail_over(rig, opened, 2)
        async with Rig(str(tmp_path)) as rig:
            state = await rig.router.open_session(VERIFIER, resumed)
            state = await rig.router.put_drafter(VERIFIER, assignment(resumed, state))
            await rounds(rig, state, 2)
            return state, log_of(rig)

    state, after = run(scenario(), timeout=60)
    assert (state.epoch, state.round) == (2, 2)
    assert audit(after) == [(1, 1), (1, 2), (2, 3), (2, 4)]


def test_an_open_behind_a_higher_fence_is_refused(tmp_path):
    """The router fenced the log at epoch 3 while an open of epoch 2 was on its way: that
    epoch is over before it began."""

    async def scenario():
        async with Rig(str(tmp_path)) as rig:
            opened, state = await rig.open(S, contract(max_new=30), m_init=2)
            await rounds(rig, state, 1)
            rig.store.logs.log(LOG).append(FenceRecord(3), None)
            last = [r for r in log_of(rig) if isinstance(r, CommitRecord)][-1]
            stale = replace(opened, epoch=2, resume=Resume(
                round=last.round, committed=last.committed, digest=last.digest,
                committed_tokens=object_uri(SCOPE, S, "committed_tokens", 1)))
            with pytest.raises(SdcpProblem) as refused:
                await rig.router.open_session(VERIFIER, stale)
            return refused.value

    refused = run(scenario())
    assert (refused.suffix, refused.status) == ("sdcp-stale-epoch", 409)
