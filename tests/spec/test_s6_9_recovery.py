"""Conformance: §6.9 Failure Handling and Recovery."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sdcp_fast.protocol.commitlog import CommitRecord, append_allowed
from sdcp_fast.protocol.messages import SessionOpen, Status
from sdcp_fast.protocol.problems import NotAssigned, StaleEpoch
from sdcp_fast.protocol.routing import RoutedSession, after_open, plan_failover, reassign_expired
from sdcp_fast.protocol.session import ScoreNeeded, State, VerifierSession
from sdcp_fast.protocol.status_table import StatusTable
from tests.spec.s6kit import (
    DRAFTER,
    PROMPT,
    SID,
    TARGET,
    VERIFIER,
    assignment,
    contract,
    open_session,
    proposal,
    run_round,
)

B = "https://drafter-b.example/"


def _table(now: float = 0.0) -> StatusTable:
    table = StatusTable()
    table.report(Status(instance=DRAFTER, role=1, load=0, queue=0, ttl_ms=100), now)
    table.report(Status(instance=B, role=1, load=50, queue=0, ttl_ms=60_000), now)
    return table


def _routed(session: VerifierSession) -> RoutedSession:
    opened = SessionOpen(session=SID, epoch=session.epoch, contract=session.contract, prompt=PROMPT,
                         commit_log="mlc://log")
    routed = RoutedSession(opened=opened, epoch=session.epoch, verifier=VERIFIER, round=session.round,
                           committed=session.committed, digest=session.digest, m_init=4)
    routed.drafter = DRAFTER
    return routed


def test_drafter_failure_reassigns_and_rejects_the_failed_drafter() -> None:
    """§6.9: when a drafter's status expires the router reassigns its sessions; the new drafter
    starts from the committed prefix; proposals from the failed drafter are rejected."""
    session = open_session()
    run_round(session, (4,), 1, 5)
    routed = _routed(session)
    plans = reassign_expired([routed], _table(), now=1.0)
    assert [p.drafter for p in plans] == [B]
    session.assign(plans[0])
    assert (plans[0].committed, plans[0].digest) == (session.committed, session.digest)
    with pytest.raises(NotAssigned):
        session.receive_proposal(proposal(session, (6,)), client=DRAFTER, now=1.0)
    ok = proposal(session, (6,), drafter=B)
    assert isinstance(session.receive_proposal(ok, client=B, now=1.0), ScoreNeeded)


def test_verifier_failure_fences_then_resumes_at_a_new_epoch() -> None:
    """§6.9: the router first appends a fence with the new epoch, then opens the session at a new
    verifier with "resume" from the last commit record, informs it of the drafter and sends a new
    assignment; the old verifier can no longer commit, older epochs are rejected."""
    old = open_session()
    done = run_round(old, (4, 5), 2, 6)
    last = CommitRecord(epoch=1, round=done.verdict.round, emitted=done.verdict.emitted,
                        committed=done.verdict.committed, digest=done.verdict.digest)
    routed = _routed(old)
    plan = plan_failover(routed, "https://verifier-2.example/", last, committed_tokens="mlc://out")
    assert plan.fence.epoch == 2 and plan.open.epoch == 2 and plan.open.resume.digest == last.digest
    log = [last, plan.fence]
    new, state = VerifierSession.open(plan.open, target_digest=TARGET, committed_tokens=old.output(0).tokens)
    assert (state.epoch, state.round, state.committed, state.digest) == (2, 1, 3, old.digest)
    a = after_open(routed, state, _table(), now=0.0)
    assert a is not None and a.epoch == 2
    new.assign(a)
    # The old verifier, partitioned, tries to commit the next round: its append is fenced.
    old.receive_proposal(proposal(old, (7,)), client=DRAFTER, now=0)
    record = old.complete_scoring(1, 8).record
    assert not append_allowed(log, record)
    old.append_done(ok=False, fenced=True)
    assert old.state is State.FENCED and old.committed == 3
    # Proposals carrying the old epoch are rejected by the new verifier.
    with pytest.raises(StaleEpoch):
        new.receive_proposal(replace(proposal(new, (7,), drafter=a.drafter), epoch=1), client=a.drafter, now=0)
    assert new.output(0).epoch == 2


def test_lost_verdict_retry_is_idempotent() -> None:
    """§6.9: proposals and verdicts are idempotent per round: a drafter retries a proposal whose
    verdict it did not receive and gets the same verdict."""
    session = open_session()
    p = proposal(session, (4, 5))
    done = run_round(session, (4, 5), 1, 9)
    assert session.receive_proposal(p, client=DRAFTER, now=5.0) == done.verdict
    assert session.committed == 2


def test_new_assignment_after_failover_names_the_session_state() -> None:
    """§6.9: the new assignment carries the committed prefix the new verifier resumed from."""
    session = open_session(contract())
    run_round(session, (4,), 1, 5)
    a = assignment(session)
    assert (a.round, a.committed, a.digest) == (1, 2, session.digest)


def test_verifier_failure_is_detected_from_ttl_and_the_session_moves_to_a_live_verifier() -> None:
    """§6.9 Verifier failure, detected as §6.1 defines liveness: a verifier whose status outlived
    its ttl_ms has failed; its open sessions move (fence, then open) to a live verifier."""
    from sdcp_fast.protocol.routing import expired_verifiers
    from sdcp_fast.protocol.status_table import choose_verifier

    table = _table()
    table.report(Status(instance=VERIFIER, role=2, load=0, queue=0, ttl_ms=1000), 0.0)
    table.report(Status(instance="https://verifier-2.example/", role=2, load=60, queue=0, ttl_ms=60_000), 0.0)
    routed = _routed(open_session())
    assert expired_verifiers([routed], table, 0.5) == []
    failed = expired_verifiers([routed], table, 1.0)
    assert failed == [routed]
    target = choose_verifier(table, 1.0, exclude=(routed.verifier,))
    assert target == "https://verifier-2.example/"
    plan = plan_failover(routed, target, None)
    assert (plan.fence.epoch, plan.open.epoch, routed.verifier) == (2, 2, target)


def test_failover_carries_the_current_sampling_policy() -> None:
    """§6.9 with §6.6: the new verifier knows only the contract, so the fail-over plan carries the
    session's current profile as a policy from the resumed round + 1, sent after the open and
    before the assignment; the resumed rounds then use the profile the router set."""
    from sdcp_fast.protocol.messages import Sampling
    from sdcp_fast.protocol.routing import policy_update

    old = open_session(contract(rule=2))
    routed = _routed(old)
    profile = Sampling(temperature_milli=700, seed=5)
    old.policy(policy_update(routed, 1, profile))
    done = run_round(old, (4,), 1, 6)
    last = CommitRecord(epoch=1, round=1, emitted=done.verdict.emitted, committed=2, digest=done.verdict.digest)
    plan = plan_failover(routed, "https://verifier-2.example/", last, committed_tokens="mlc://out")
    assert plan.policy is not None and (plan.policy.from_round, plan.policy.sampling) == (2, profile)
    new, state = VerifierSession.open(plan.open, target_digest=TARGET, committed_tokens=old.output(0).tokens)
    new.policy(plan.policy)
    new.assign(after_open(routed, state, _table(), now=0.0))
    assert new.sampling_for(2) == profile == old.sampling_for(2)


def test_a_session_open_at_a_higher_epoch_replaces_the_session_at_this_verifier() -> None:
    """§6.9: a session opened again at a new epoch (here at the same verifier) starts over from
    the resume; the session of the old epoch can no longer commit or release output (409
    sdcp-stale-epoch), and a session-open with an older epoch is refused likewise."""
    from sdcp_fast.protocol.messages import Resume
    from sdcp_fast.protocol.registry import SessionRegistry

    registry = SessionRegistry()
    first = SessionOpen(session=SID, epoch=1, contract=contract(), prompt=PROMPT, commit_log="mlc://log")
    old, _ = registry.open(first, target_digest=TARGET)
    old.assign(assignment(old))
    done = run_round(old, (4,), 1, 6)
    old.receive_proposal(proposal(old, (7,)), client=DRAFTER, now=0)  # a round in flight
    resume = Resume(round=1, committed=2, digest=done.verdict.digest, committed_tokens="mlc://out")
    new, state = registry.open(replace(first, epoch=2, resume=resume), target_digest=TARGET,
                               committed_tokens=(4, 6))
    assert (state.epoch, state.round, state.committed) == (2, 1, 2) and registry.get(SID) is new
    with pytest.raises(StaleEpoch):
        old.complete_scoring(1, 8)
    with pytest.raises(StaleEpoch):
        old.output(0)
    with pytest.raises(StaleEpoch):
        registry.open(first, target_digest=TARGET)


def test_a_redelivered_event_reassigns_once() -> None:
    """§6.9 Lost messages: the verifier may send an event again; the router acts on a switch
    once, so the session is not moved twice."""
    from sdcp_fast.protocol.messages import Action, Event
    from sdcp_fast.protocol.routing import on_event

    table = _table()
    table.report(Status(instance="https://drafter-c.example/", role=1, load=60, queue=0, ttl_ms=60_000), 0.0)
    routed = _routed(open_session())
    event = Event(session=SID, epoch=1, kind=Action.SWITCH, committed=3, digest=b"\x03" * 32)
    first = on_event(routed, event, table, 0.0)
    assert first is not None and first.drafter == B
    assert on_event(routed, event, table, 0.0) is None and routed.drafter == B
