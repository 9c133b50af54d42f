"""Conformance: §6.8 Commit Log (as the verifier session uses it)."""

from __future__ import annotations

from sdcp_fast.protocol.commitlog import CommitRecord, FenceRecord, append_allowed, append_survived
from tests.spec.s6kit import DRAFTER, open_session, proposal, run_round


def test_commit_records_carry_current_epoch_and_follow_the_last_one() -> None:
    """§6.8: a commit record appended by a verifier MUST carry the session's current epoch and
    follow the last record it wrote."""
    session = open_session(epoch=4)
    records = []
    for tokens in ((1, 3), (3,), (4, 5)):
        session.receive_proposal(proposal(session, tokens), client=DRAFTER, now=0)
        records.append(session.complete_scoring(len(tokens), 9).record)
        session.append_done(ok=True)
    assert {r.epoch for r in records} == {4}
    assert [r.round for r in records] == [1, 2, 3]
    assert [r.committed for r in records] == [3, 5, 8]
    assert records[-1].digest == session.digest


def test_appends_below_a_fence_fail() -> None:
    """§6.8: after a fence record with epoch E+1, appends carrying an epoch lower than E+1 MUST fail."""
    session = open_session(epoch=1)
    done = run_round(session, (1,), 1, 3)
    log = [CommitRecord(epoch=1, round=1, emitted=done.verdict.emitted, committed=2, digest=done.verdict.digest),
           FenceRecord(epoch=2)]
    session.receive_proposal(proposal(session, (3,)), client=DRAFTER, now=0)
    record = session.complete_scoring(1, 4).record
    assert not append_allowed(log, record)
    assert append_allowed(log, CommitRecord(epoch=2, round=2, emitted=(3,), committed=3, digest=bytes(32)))


def test_read_after_append_detects_an_earlier_fence() -> None:
    """§6.8: if the MLC cannot enforce fencing, the verifier MUST read the log after its append and
    treat the append as failed if a fence with a higher epoch precedes its record."""
    own = CommitRecord(epoch=1, round=2, emitted=(3,), committed=3, digest=bytes(32))
    assert not append_survived([FenceRecord(epoch=2), own], 1)
    assert append_survived([FenceRecord(epoch=1), own], 1)


def test_a_failed_conditional_append_has_one_meaning() -> None:
    """§6.8 with §6.3 Commit: after a conditional append fails (or its answer is lost), the log
    read again decides: our record there with no higher fence before it is committed; a higher
    fence is fenced (discard, release nothing, stop); anything else is lost, handled as fenced."""
    from sdcp_fast.protocol.commitlog import classify_failed_append
    from sdcp_fast.protocol.session import Discarded, RoundDone, State

    outcomes = {}
    for name, after in (("committed", lambda own: [own]), ("fenced", lambda own: [FenceRecord(2)]),
                        ("lost", lambda own: [CommitRecord(1, 1, (9,), 1, bytes(32))])):
        session = open_session(epoch=1)
        session.receive_proposal(proposal(session, (1,)), client=DRAFTER, now=0)
        own = session.complete_scoring(1, 3).record
        kind = classify_failed_append([FenceRecord(1), *after(own)], own)
        assert kind == name
        done = session.append_done(ok=kind == "committed", fenced=kind != "committed")
        outcomes[kind] = (type(done), session.state, session.output(0).tokens if kind == "committed" else ())
    assert outcomes == {"committed": (RoundDone, State.READY, (1, 3)),
                        "fenced": (Discarded, State.FENCED, ()), "lost": (Discarded, State.FENCED, ())}
