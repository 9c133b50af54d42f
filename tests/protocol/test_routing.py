"""Router decisions (sdcp_fast/protocol/routing.py, draft §6.1, §6.6, §6.9)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sdcp_fast.protocol.commitlog import CommitRecord, FenceRecord
from sdcp_fast.protocol.messages import (
    ROLE_VERIFIER,
    Action,
    Event,
    Policy,
    Sampling,
    SessionOpen,
    SessionState,
)
from sdcp_fast.protocol.problems import BadRequest
from sdcp_fast.protocol.routing import (
    RoutedSession,
    Watch,
    after_open,
    after_probe,
    assign,
    confirmed,
    expired_drafters,
    expired_verifiers,
    new_session_id,
    note_progress,
    on_event,
    open_message,
    plan_failover,
    policy_update,
    reassign_expired,
    stall_after,
    stalled,
)
from sdcp_fast.protocol.session import VerifierSession
from sdcp_fast.protocol.status_table import StatusTable
from tests.protocol.sessionkit import PROMPT, SID, TARGET, VERIFIER, contract, status, table_with


def routed(*, session=SID, self_decoding=False, **overrides):
    opened = SessionOpen(session=session, epoch=1, contract=contract(), prompt=PROMPT, commit_log="mlc://log")
    fields = dict(opened=opened, epoch=1, verifier=VERIFIER, m_init=4, watch=Watch(self_decoding=self_decoding))
    fields.update(overrides)
    return RoutedSession(**fields)


def test_assignment_then_confirmation_carries_verifier_state():
    table = table_with(status("a"))
    r = routed()
    a = assign(r, table, 0.0)
    assert a is not None and a.drafter == "a" and r.drafter == "a" and a.m_init == 4
    state = SessionState(session=SID, epoch=1, round=3, committed=7, digest=b"\x07" * 32)
    final = confirmed(r, state)
    assert (final.round, final.committed, final.digest) == (3, 7, b"\x07" * 32)
    assert assign(r, StatusTable(), 0.0) is None
    with pytest.raises(ValueError):
        confirmed(routed(), state)


def test_policy_update_is_carried_by_later_assignments():
    table = table_with(status("a"))
    r = routed()
    msg = policy_update(r, 2, Sampling(temperature_milli=0))
    assert msg.from_round == 2 and msg.session == SID
    a = assign(r, table, 0.0)
    assert a.sampling == Sampling(temperature_milli=0) and a.contract == contract()


def test_events():
    table = table_with(status("a", load=0), status("b", load=50))
    r = routed()
    assign(r, table, 0.0)
    ev = Event(session=SID, epoch=1, kind=Action.SWITCH, committed=5, digest=b"\x05" * 32)
    a = on_event(r, ev, table, 0.0)
    assert a.drafter == "b" and r.committed == 5 and a.committed == 5
    # The same event delivered again: acted on once (§6.9 lost messages, idempotent events).
    assert on_event(r, ev, table, 0.0) is None and r.drafter == "b"
    # Every drafter tried: rotate rather than stall, still never the current one.
    ev2 = Event(session=SID, epoch=1, kind=Action.SWITCH, committed=6, digest=b"\x06" * 32)
    a = on_event(r, ev2, table, 0.0)
    assert a.drafter == "a"
    back = on_event(r, Event(session=SID, epoch=1, kind=Action.SELF_DECODE, committed=6, digest=bytes(32)),
                    table, 0.0)
    assert back.drafter == "a"
    assert on_event(r, Event(session=SID, epoch=0, kind=Action.SWITCH, committed=9, digest=bytes(32)),
                    table, 0.0) is None
    assert on_event(r, Event(session=SID, epoch=1, kind=Action.CONTINUE, committed=6, digest=bytes(32)),
                    table, 0.0) is None
    assert on_event(r, Event(session=SID, epoch=1, kind=Action.FINISH, committed=6, digest=bytes(32)),
                    table, 0.0) is None
    assert r.done
    lonely = routed()
    assert on_event(lonely, ev, StatusTable(), 0.0) is None
    # The only live drafter: kept rather than leaving the session unassigned.
    single = table_with(status("a"))
    alone = routed()
    assign(alone, single, 0.0)
    assert on_event(alone, ev, single, 0.0).drafter == "a"


def test_reassign_expired_drafters():
    table = table_with(status("a", ttl_ms=100), status("b", ttl_ms=10_000))
    r1, r2, r3 = routed(), routed(session=b"2" * 16), routed(session=b"3" * 16, done=True)
    r1.drafter, r2.drafter, r3.drafter = "a", "b", "a"
    plans = reassign_expired([r1, r2, r3, routed()], table, 1.0)
    assert [(p.session, p.drafter) for p in plans] == [(SID, "b")]
    assert reassign_expired([routed(drafter="x")], StatusTable(), 1.0) == []


def test_a_self_decoding_session_is_not_taken_from_its_expired_drafter():
    """Its drafter was told to stop, so it goes quiet: that is not a failure to repair, and a
    new drafter would end the self-decoding the ladder chose."""
    table = table_with(status("a", ttl_ms=100), status("b", ttl_ms=10_000))
    drafting, decoding = routed(drafter="a"), routed(session=b"2" * 16, drafter="a", self_decoding=True)
    assert expired_drafters([drafting, decoding], table, 1.0) == [drafting]
    assert [p.session for p in reassign_expired([drafting, decoding], table, 1.0)] == [SID]


def test_a_session_whose_verifier_expired_is_failed_over_not_probed():
    """A stopped verifier stops committing before its status expires (ttl 1 s < 3 drafter ttls):
    its sessions are the fail-over's, and the sweep must not ask it where they stand first (the
    probe of a hung verifier holds the sweep, and with it the fail-over, for its whole timeout)."""
    table = table_with(status("a", ttl_ms=100), status("b", ttl_ms=10_000),
                       status(VERIFIER, role=ROLE_VERIFIER, ttl_ms=1000))
    r = routed(drafter="a")
    note_progress(r, 0, 0.0)
    assert stalled([r], table, 0.9) == expired_drafters([r], table, 0.9) == [r]  # the verifier is live
    assert stalled([r], table, 3.0) == expired_drafters([r], table, 3.0) == []  # it expired at 1.0
    assert expired_verifiers([r], table, 3.0) == [r]


def test_the_watchdog_looks_at_a_session_that_committed_nothing_for_three_ttls():
    table = table_with(status("a", ttl_ms=1000), status("b", ttl_ms=1000))
    r = routed(drafter="a")
    assert note_progress(r, 0, 0.0) and not note_progress(r, 0, 1.0)  # the first look counts; no growth then
    assert stall_after(r, table) == 3.0 and stall_after(routed(), table) == 10.0  # no drafter: the default
    assert stalled([r], table, 2.9) == [] and stalled([r], table, 3.0) == [r]
    assert stalled([routed(drafter="a", done=True)], table, 9.0) == []
    assert note_progress(r, 5, 2.5) and stalled([r], table, 5.0) == []  # growth resets the period
    table = table_with(status("a"), status("b"), now=6.0)  # both report again
    state = SessionState(session=SID, epoch=1, round=2, committed=5, digest=b"\x05" * 32)
    assert after_probe(r, replace(state, epoch=2), table, 6.0) is None  # another epoch's answer
    a = after_probe(r, state, table, 6.0)  # nothing more committed: another drafter
    assert a is not None and a.drafter == "b" == r.drafter and r.watch.progress == 6.0
    assert after_probe(r, replace(state, committed=7), table, 6.1) is None  # it moved on
    assert after_probe(r, replace(state, committed=7, state=int(Action.FINISH)), table, 6.2) is None
    assert after_probe(r, replace(state, committed=8, state=int(Action.SELF_DECODE)), table, 6.3) is None
    assert r.watch.self_decoding and r.watch.progress == 6.3
    assert expired_drafters([r], table_with(status("a"), now=9.0), 9.0) == []  # b was told to stop: not a failure


def test_failover_plan_fences_then_resumes():
    table = table_with(status("a"))
    r = routed(round=4, committed=9, digest=b"\x09" * 32)
    r.drafter = "a"
    last = CommitRecord(epoch=1, round=4, emitted=(1,), committed=9, digest=b"\x09" * 32)
    plan = plan_failover(r, "https://v2/", last, committed_tokens="mlc://out", target_kv="mlc://kv")
    assert plan.fence == FenceRecord(epoch=2)
    assert plan.open.epoch == 2 and plan.open.resume.round == 4 and plan.open.resume.committed == 9
    assert plan.open.resume.target_kv == "mlc://kv" and r.verifier == "https://v2/"
    state = SessionState(session=SID, epoch=2, round=4, committed=9, digest=b"\x09" * 32)
    a = after_open(r, state, table, 0.0)
    assert a.drafter == "a" and a.epoch == 2 and a.verifier == "https://v2/"
    with pytest.raises(ValueError):
        plan_failover(r, "https://v3/", last)


def test_failover_without_commits_opens_afresh_and_picks_live_drafter():
    table = table_with(status("b"))
    r = routed()
    r.drafter = "gone"
    plan = plan_failover(r, "https://v2/", None)
    assert plan.open.resume is None and plan.open.epoch == 2
    session, state = VerifierSession.open(plan.open, target_digest=TARGET)
    a = after_open(r, state, table, 0.0)
    assert a.drafter == "b" and a.digest == state.digest and a.committed == 0
    session.assign(a)
    assert session.drafter == "b"


def test_open_message_and_follow_ignores_old_epochs():
    r = routed()
    assert open_message(r).commit_log == "mlc://log"
    r.follow(SessionState(session=SID, epoch=9, round=3, committed=3, digest=bytes(32)))
    assert r.round == 0
    r.follow(Event(session=SID, epoch=1, kind=Action.SWITCH, committed=0, digest=b"\x01" * 32))
    assert r.digest == b"\x01" * 32


def test_expiry_of_verifiers_and_drafters_from_ttl():
    table = table_with(status(VERIFIER, role=2, ttl_ms=1000), status("https://v2/", role=2, ttl_ms=9000),
                       status("a", ttl_ms=500))
    on_v1, on_v2 = routed(), routed(session=b"2" * 16, verifier="https://v2/")
    ended, unseen = routed(session=b"3" * 16, done=True), routed(session=b"4" * 16, verifier="https://new/")
    sessions = [on_v1, on_v2, ended, unseen]
    assert expired_verifiers(sessions, table, 0.99) == []
    assert expired_verifiers(sessions, table, 1.0) == [on_v1]
    assert table.expired("a", 0.5) and not table.expired("https://new/", 99.0)  # never heard of: not expired
    table.expire(2.0)  # dropping the entries does not forget that they expired
    assert table.expired(VERIFIER, 2.0) and expired_verifiers(sessions, table, 2.0) == [on_v1]
    table.report(status(VERIFIER, role=2, ttl_ms=1000), 3.0)  # back again
    assert expired_verifiers(sessions, table, 3.5) == []


def test_failover_carries_the_sampling_policy_from_the_next_round():
    r = routed(round=4, committed=9, digest=b"\x09" * 32)
    early = policy_update(r, 2, Sampling(temperature_milli=500))
    pending = policy_update(r, 8, Sampling(temperature_milli=0, seed=1))
    last = CommitRecord(epoch=1, round=4, emitted=(1,), committed=9, digest=b"\x09" * 32)
    plan = plan_failover(r, "https://v2/", last, committed_tokens="mlc://out")
    assert plan.policy == Policy(session=SID, from_round=5, sampling=early.sampling)
    assert plan.later == (pending,)
    assert plan_failover(routed(), "https://v2/", None).policy is None  # never updated
    later_only = routed()
    policy_update(later_only, 3, Sampling(top_k=2))
    plan = plan_failover(later_only, "https://v2/", None)
    assert plan.policy is None and [p.from_round for p in plan.later] == [3]
    # The new verifier takes every policy of a plan, in its order, before any proposal.
    in_effect = routed()
    policy_update(in_effect, 1, Sampling(top_k=2))
    policy_update(in_effect, 6, Sampling(top_k=3))
    plan = plan_failover(in_effect, "https://v2/", None)
    session, _ = VerifierSession.open(plan.open, target_digest=TARGET)
    for policy in (plan.policy, *plan.later):
        session.policy(policy)
    assert session.sampling_for(1) == Sampling(top_k=2) and session.sampling_for(6) == Sampling(top_k=3)


def test_new_session_id_takes_sixteen_caller_bytes():
    assert new_session_id(b"\x01" * 16) == b"\x01" * 16
    assert new_session_id(bytearray(16)) == bytes(16)
    for bad in (b"", b"x" * 15, b"x" * 17, "x" * 16):
        with pytest.raises(BadRequest):
            new_session_id(bad)
