"""Verifier session state machine (sdcp_fast/protocol/session.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sdcp_fast.protocol.contract import contract_digest
from sdcp_fast.protocol.digests import extend_digest, prefix_digest
from sdcp_fast.protocol.messages import Action, Policy, Resume, Sampling, SessionOpen, Verdict
from sdcp_fast.protocol.peer import Peer, PeerRole
from sdcp_fast.protocol.problems import (
    BadContract,
    BadProposal,
    BadRequest,
    Limit,
    NotAssigned,
    QUnavailable,
    SessionClosed,
    StaleBase,
    StaleEpoch,
)
from sdcp_fast.protocol.randoms import verifier_uniform
from sdcp_fast.protocol.session import (
    TRANSITIONS,
    AppendNeeded,
    Discarded,
    Input,
    InvalidTransition,
    Pending,
    RoundDone,
    ScoreNeeded,
    State,
    VerifierSession,
)
from tests.protocol.sessionkit import (
    DRAFTER,
    PROMPT,
    SID,
    STATUS,
    TARGET,
    assignment,
    contract,
    open_session,
    proposal,
    q_bytes,
    run_round,
)


def d0(c=None):
    return prefix_digest(contract_digest(c or contract()), PROMPT)


def test_open_answers_round_zero_with_d0():
    session = open_session(drafter=None)
    state = session.session_state()
    assert (state.round, state.committed, state.digest, state.state) == (0, 0, d0(), None)
    assert session.state is State.READY


def test_open_refuses_foreign_target_and_bad_epoch_and_cache_ref_prompt():
    so = SessionOpen(session=SID, epoch=1, contract=contract(), prompt=PROMPT, commit_log="l")
    with pytest.raises(BadContract):
        VerifierSession.open(so, target_digest=b"\xff" * 32)
    with pytest.raises(BadRequest):
        VerifierSession.open(replace(so, epoch=0), target_digest=TARGET)
    with pytest.raises(BadRequest):
        VerifierSession.open(replace(so, prompt="mlc://prompt"), target_digest=TARGET)
    session, state = VerifierSession.open(replace(so, prompt="mlc://prompt"), target_digest=TARGET,
                                          prompt_tokens=PROMPT)
    assert state.digest == d0()
    with pytest.raises(BadRequest):
        VerifierSession.open(so, target_digest=TARGET, committed_tokens=(1,))


def test_open_with_max_new_zero_is_finished():
    session = open_session(contract(max_new=0), drafter=None)
    assert session.state is State.FINISHED
    assert session.session_state().state == Action.FINISH
    out = session.output(0)
    assert out.final and out.finish is Action.FINISH and out.tokens == ()


def test_resume_checks_tokens_against_digest():
    tokens = (5, 6, 7)
    digest = extend_digest(d0(), tokens)
    so = SessionOpen(session=SID, epoch=2, contract=contract(), prompt=PROMPT, commit_log="l",
                     resume=Resume(round=2, committed=3, digest=digest, committed_tokens="mlc://out"))
    session, state = VerifierSession.open(so, target_digest=TARGET, committed_tokens=tokens)
    assert (state.epoch, state.round, state.committed, state.digest) == (2, 2, 3, digest)
    assert session.output(1).tokens == (6, 7)
    with pytest.raises(BadRequest):
        VerifierSession.open(so, target_digest=TARGET, committed_tokens=(5, 6))
    with pytest.raises(BadRequest):
        VerifierSession.open(so, target_digest=TARGET, committed_tokens=(5, 6, 8))
    # A resumed session whose output already ended stays ended.
    ended = replace(so, resume=Resume(round=1, committed=2, digest=extend_digest(d0(), (5, 2)),
                                      committed_tokens="x"))
    session, state = VerifierSession.open(ended, target_digest=TARGET, committed_tokens=(5, 2))
    assert session.state is State.FINISHED


def test_rule1_round_commits_after_append_only():
    session = open_session()
    work = session.receive_proposal(proposal(session, (4, 5, 6)), client=DRAFTER, now=1.5)
    assert isinstance(work, ScoreNeeded)
    assert work.context == PROMPT and work.proposed == (4, 5, 6) and work.uniforms is None
    assert not work.needs_q and work.rule == 1 and not work.self_decoded
    append = session.complete_scoring(2, 9, load=20)
    assert isinstance(append, AppendNeeded)
    assert append.record.emitted == (4, 5, 9) and append.record.epoch == 1 and append.record.round == 1
    assert session.output(0).tokens == ()  # nothing before the append
    assert session.committed == 0
    done = session.append_done(ok=True)
    assert isinstance(done, RoundDone)
    v = done.verdict
    assert (v.round, v.accepted, v.emitted, v.committed, v.load) == (1, 2, (4, 5, 9), 3, 20)
    assert v.digest == extend_digest(d0(), (4, 5, 9)) == session.digest
    assert done.start == 0 and done.tokens == (4, 5, 9) and done.events == ()
    assert session.output(0).tokens == (4, 5, 9) and session.last_activity == 1.5


def test_truncation_after_stop_and_at_max_new():
    session = open_session(contract(stop=(2,), max_new=100))
    done = run_round(session, (4, 2, 6), 3, 7)
    assert done.verdict.emitted == (4, 2) and done.verdict.action is Action.FINISH
    assert session.state is State.FINISHED
    assert [e.kind for e in done.events] == [Action.FINISH]
    session = open_session(contract(stop=(), max_new=4))
    run_round(session, (4, 5), 2, 6)
    done = run_round(session, (7, 8), 2, 9)
    assert done.verdict.emitted == (7,) and session.committed == 4
    assert session.output(0).final and session.output(0).finish is Action.FINISH


def test_idempotent_retry_returns_recorded_verdict():
    session = open_session()
    p = proposal(session, (4, 5))
    session.receive_proposal(p, client=DRAFTER, now=0)
    assert session.receive_proposal(replace(p, status=replace(STATUS, load=99)), client=DRAFTER,
                                    now=0) == Pending(1)
    session.complete_scoring(1, 8)
    assert session.receive_proposal(p, client=DRAFTER, now=0) == Pending(1)
    done = session.append_done(ok=True)
    assert session.receive_proposal(p, client=DRAFTER, now=0) is done.verdict
    assert session.verdict_for(1) is done.verdict
    with pytest.raises(StaleBase):
        session.receive_proposal(replace(p, round=2), client=DRAFTER, now=0)  # old base


def test_different_request_for_round_in_progress_is_stale_base():
    session = open_session()
    session.receive_proposal(proposal(session, (4, 5)), client=DRAFTER, now=0)
    with pytest.raises(StaleBase) as info:
        session.receive_proposal(proposal(session, (4, 6)), client=DRAFTER, now=0)
    assert info.value.extra["session_state"]["round"] == 0


def test_stale_base_carries_session_state():
    session = open_session()
    run_round(session, (4,), 1, 5)
    stale = replace(proposal(session, (6,)), base=1, base_digest=extend_digest(d0(), (4,)))
    with pytest.raises(StaleBase) as info:
        session.receive_proposal(stale, client=DRAFTER, now=0)
    body = info.value.extra["session_state"]
    assert (body["round"], body["committed"], body["digest"]) == (1, 2, session.digest)
    with pytest.raises(StaleBase):
        session.receive_proposal(replace(proposal(session, (6,)), round=3), client=DRAFTER, now=0)
    with pytest.raises(StaleBase):
        session.receive_proposal(replace(proposal(session, (6,)), base_digest=bytes(32)), client=DRAFTER,
                                 now=0)


def test_authorization_fencing_limits_and_session_checks():
    session = open_session(m_init=3)
    with pytest.raises(NotAssigned):
        session.receive_proposal(proposal(session, (4,)), client="https://other/", now=0)
    with pytest.raises(NotAssigned):
        session.receive_proposal(proposal(session, (4,), drafter="https://other/"), client=DRAFTER, now=0)
    with pytest.raises(StaleEpoch):
        session.receive_proposal(proposal(session, (4,), epoch=2), client=DRAFTER, now=0)
    with pytest.raises(Limit):
        session.receive_proposal(proposal(session, ()), client=DRAFTER, now=0)
    with pytest.raises(Limit):
        session.receive_proposal(proposal(session, (1, 1, 1, 1)), client=DRAFTER, now=0)
    with pytest.raises(BadRequest):
        session.receive_proposal(replace(proposal(session, (4,)), session=b"T" * 16), client=DRAFTER, now=0)
    unassigned = open_session(drafter=None)
    with pytest.raises(NotAssigned):
        unassigned.receive_proposal(proposal(unassigned, (4,)), client=DRAFTER, now=0)
    assert session.state is State.READY


def test_assign_checks_epoch_contract_and_resets_cap():
    session = open_session(m_init=2)
    assert session.control.limit() == 2
    with pytest.raises(StaleEpoch):
        session.assign(replace(assignment(session), epoch=3))
    with pytest.raises(BadContract):
        session.assign(replace(assignment(session), contract=contract(max_new=5)))
    with pytest.raises(BadRequest):
        session.assign(replace(assignment(session), session=b"X" * 16))
    state = session.assign(assignment(session, drafter="https://b/", m_init=99))
    assert state.round == 0 and session.drafter == "https://b/" and session.control.limit() == 8


def test_rule2_q_checked_before_uniforms_and_seeded_uniforms():
    c = contract(rule=2, sampling=Sampling(seed=42))
    session = open_session(c)
    work = session.receive_proposal(proposal(session, (1, 3)), client=DRAFTER, now=0)
    assert isinstance(work, ScoreNeeded) and work.needs_q and work.uniforms is None
    assert work.sampling == Sampling(seed=42) and work.q_rows == "mlc://q"
    with pytest.raises(InvalidTransition):
        session.complete_scoring(0, 1)
    uniforms = session.provide_q(q_rows=q_bytes([[0.5, 0.5, 0, 0], [0, 0, 0.5, 0.5]]), vocab=4)
    assert uniforms.accept == tuple(verifier_uniform(42, SID, 1, i, 0) for i in (1, 2, 3))
    assert uniforms.draw == tuple(verifier_uniform(42, SID, 1, i, 1) for i in (1, 2, 3))
    assert uniforms(2, 0) == uniforms.accept[1] and uniforms(3, 1) == uniforms.draw[2]
    with pytest.raises(InvalidTransition):
        session.provide_q([0.5, 0.5])
    session.complete_scoring(2, 0)
    assert isinstance(session.append_done(ok=True), RoundDone)


def test_rule2_q_problems_discard_the_round():
    session = open_session(contract(rule=2))
    p = proposal(session, (1, 3))
    session.receive_proposal(p, client=DRAFTER, now=0)
    with pytest.raises(QUnavailable):
        session.provide_q()
    assert session.state is State.READY and session.committed == 0
    session.receive_proposal(p, client=DRAFTER, now=0)
    with pytest.raises(BadProposal):
        session.provide_q([0.5, 0.0])
    assert session.state is State.READY
    session.receive_proposal(p, client=DRAFTER, now=0)
    with pytest.raises(BadProposal):
        session.provide_q(q_rows=b"\x00" * 12, vocab=4)
    with pytest.raises(BadProposal):
        session.receive_proposal(replace(p, q_rows=None), client=DRAFTER, now=0)
    # Without a seed the values come from the CSPRNG: distinct and in [0, 1).
    session.receive_proposal(p, client=DRAFTER, now=0)
    u = session.provide_q([0.25, 0.25])
    assert all(0.0 <= r < 1.0 for r in u.accept + u.draw) and len(set(u.accept)) == 3


def test_scoring_result_is_checked():
    session = open_session()
    session.receive_proposal(proposal(session, (4, 5)), client=DRAFTER, now=0)
    for bad in ((3, 1, 0), (-1, 1, 0), (0, -1, 0), (0, 1 << 32, 0), (0, 1, 101)):
        with pytest.raises(InvalidTransition):
            session.complete_scoring(bad[0], bad[1], load=bad[2])
    assert session.abandon() == Discarded(1, closed=False)
    assert session.state is State.READY


def test_append_failure_discards_and_fence_stops_serving():
    session = open_session()
    p = proposal(session, (4, 5))
    session.receive_proposal(p, client=DRAFTER, now=0)
    session.complete_scoring(2, 6)
    assert session.append_done(ok=False) == Discarded(1, closed=False)
    assert session.committed == 0 and session.state is State.READY and session.verdict_for(1) is None
    session.receive_proposal(p, client=DRAFTER, now=0)
    session.complete_scoring(2, 6)
    assert session.append_done(ok=False, fenced=True) == Discarded(1, closed=True)
    assert session.state is State.FENCED and session.closed and session.committed == 0
    with pytest.raises(StaleEpoch):
        session.receive_proposal(p, client=DRAFTER, now=0)
    with pytest.raises(StaleEpoch):
        session.output(0)
    with pytest.raises(StaleEpoch):
        session.assign(assignment(session))
    with pytest.raises(StaleEpoch):
        session.complete_scoring(0, 1)


def test_engine_inputs_out_of_order_are_invalid_transitions():
    session = open_session()
    for call in (lambda: session.complete_scoring(0, 1), lambda: session.append_done(ok=True),
                 session.abandon, session.self_decode, lambda: session.provide_q([1.0])):
        with pytest.raises(InvalidTransition):
            call()


def test_policy_applies_from_round_and_must_be_in_future():
    session = open_session()
    with pytest.raises(BadRequest):
        session.policy(Policy(session=SID, from_round=0, sampling=Sampling(top_k=3)))
    session.policy(Policy(session=SID, from_round=3, sampling=Sampling(top_k=3)))
    session.policy(Policy(session=SID, from_round=2, sampling=Sampling(top_k=2)))
    assert session.sampling_for(1) is None
    assert session.sampling_for(2) == Sampling(top_k=2) and session.sampling_for(5) == Sampling(top_k=3)
    session.receive_proposal(proposal(session, (4,)), client=DRAFTER, now=0)
    with pytest.raises(BadRequest):  # round 1 is in progress: its profile is fixed
        session.policy(Policy(session=SID, from_round=1, sampling=Sampling(top_k=1)))
    with pytest.raises(BadRequest):
        session.policy(Policy(session=b"X" * 16, from_round=9, sampling=Sampling()))


def test_output_indices_and_from():
    session = open_session()
    run_round(session, (4, 5), 2, 6)
    run_round(session, (7,), 0, 8)
    assert session.output(0).tokens == (4, 5, 6, 8)
    assert session.output(3).tokens == (8,) and session.output(3).from_ == 3
    assert session.output(9).tokens == () and not session.output(9).final
    with pytest.raises(BadRequest):
        session.output(-1)


def _escalate(session, times):
    done = None
    for _ in range(times):
        done = run_round(session, (4, 5), 0, 6)
    return done


def test_reduce_then_switch_event_revokes_drafter():
    session = open_session(contract(low_rounds=1, fallback=(1, 2)), m_init=8)
    done = _escalate(session, 1)
    assert done.verdict.action is Action.REDUCE and done.verdict.m_cap == 4 and done.verdict.low == 1
    done = _escalate(session, 1)
    assert done.verdict.action is Action.SWITCH and session.revoked
    assert [e.kind for e in done.events] == [Action.SWITCH]
    assert done.events[0].committed == session.committed and done.events[0].digest == session.digest
    with pytest.raises(NotAssigned):
        session.receive_proposal(proposal(session, (4,)), client=DRAFTER, now=0)
    # The old drafter can still fetch the verdict it may have lost.
    assert session.receive_proposal(replace(proposal(session, (4, 5)), round=2), client=DRAFTER,
                                    now=0) == done.verdict
    session.assign(assignment(session, drafter="https://b/"))
    assert not session.revoked and session.control.j == 2  # j persists across the drafter change


def test_fail_ends_session():
    session = open_session(contract(low_rounds=1, fallback=(5,)))
    done = _escalate(session, 1)
    assert done.verdict.action is Action.FAIL and session.state is State.FAILED
    assert [e.kind for e in done.events] == [Action.FAIL]
    out = session.output(0)
    assert out.final and out.finish is Action.FAIL and out.tokens == (6,)
    with pytest.raises(SessionClosed):
        session.receive_proposal(proposal(session, (4,)), client=DRAFTER, now=0)
    with pytest.raises(SessionClosed):
        session.assign(assignment(session))
    with pytest.raises(SessionClosed):
        session.policy(Policy(session=SID, from_round=9, sampling=Sampling()))
    assert session.session_state().state == Action.FAIL


@pytest.mark.parametrize("how", ["stop", "max_new", "open"])
def test_finished_session_takes_no_assignment_policy_or_proposal(how):
    """A FINISHED session is as closed as a FAILED one: a late PUT .../drafter (a router
    re-assigning after a switch event) or policy update changes nothing and is answered
    sdcp-session-closed, carrying the final session-state."""
    if how == "open":
        session = open_session(contract(max_new=0), drafter=None)
    else:
        session = open_session(contract(stop=(2,), max_new=100) if how == "stop" else contract(stop=(), max_new=2))
        run_round(session, (4, 2), 2, 7)
    assert session.state is State.FINISHED
    before = (session.drafter, session.revoked, session.control.snapshot(), session.session_state())
    calls = [lambda: session.assign(assignment(session, drafter="https://b/", m_init=3)),
             lambda: session.policy(Policy(session=SID, from_round=9, sampling=Sampling(top_k=2)))]
    if session.drafter is not None:  # with none assigned, a proposal is not-assigned first (§6.3's order)
        calls.append(lambda: session.receive_proposal(proposal(session, (4,)), client=DRAFTER, now=0))
    for call in calls:
        with pytest.raises(SessionClosed) as info:
            call()
        assert info.value.extra["session_state"]["state"] == int(Action.FINISH)
    assert (session.drafter, session.revoked, session.control.snapshot(), session.session_state()) == before
    assert session.sampling_for(9) == session.contract.sampling
    assert session.state is State.FINISHED


def self_decoding_session(**overrides):
    fields = dict(low_rounds=1, fallback=(3, 2), self_load=50, self_max=3, stop=(2,))
    fields.update(overrides)
    session = open_session(contract(**fields))
    done = _escalate(session, 1)
    assert done.verdict.action is Action.SELF_DECODE and session.state is State.SELF_DECODING
    assert done.events == ()
    return session


def _self_step(session, token, load=0):
    work = session.self_decode()
    assert work.self_decoded and work.proposed == () and not work.needs_q
    session.complete_scoring(0, token, load=load)
    return session.append_done(ok=True)


def test_self_decoding_commits_one_token_per_round_until_self_max():
    session = self_decoding_session()
    assert session.session_state().state == Action.SELF_DECODE
    with pytest.raises(NotAssigned):
        session.receive_proposal(proposal(session, (4,)), client=DRAFTER, now=0)
    rounds = []
    for token in (7, 8, 9):
        done = _self_step(session, token)
        rounds.append(done.verdict.round)
        assert done.verdict.emitted == (token,) and done.verdict.accepted == 0
    assert rounds == [2, 3, 4]
    assert session.state is State.READY and [e.kind for e in done.events] == [Action.SELF_DECODE]
    assert session.output(0).tokens == (6, 7, 8, 9)
    session.assign(assignment(session))
    run_round(session, (4,), 1, 5)


def test_self_decoding_stops_when_load_exceeds_self_load_and_on_stop_token():
    session = self_decoding_session()
    done = _self_step(session, 7, load=80)
    assert session.state is State.READY and [e.kind for e in done.events] == [Action.SELF_DECODE]
    session = self_decoding_session()
    done = _self_step(session, 2)
    assert session.state is State.FINISHED and done.verdict.action is Action.FINISH


def test_self_decoding_rule2_gets_a_draw_uniform_and_can_be_abandoned():
    session = self_decoding_session(rule=2, sampling=Sampling(seed=7))
    work = session.self_decode()
    assert work.uniforms is not None and work.uniforms.draw == (verifier_uniform(7, SID, 2, 1, 1),)
    assert session.abandon() == Discarded(2, closed=False)
    assert session.state is State.SELF_DECODING
    session.self_decode()
    session.complete_scoring(0, 9)
    assert session.append_done(ok=False) == Discarded(2, closed=False)
    assert session.state is State.SELF_DECODING


def test_assignment_ends_self_decoding():
    session = self_decoding_session()
    session.assign(assignment(session))
    assert session.state is State.READY
    session = self_decoding_session()
    session.self_decode()
    session.assign(assignment(session))  # mid-round: the period ends after this token
    session.complete_scoring(0, 9)
    done = session.append_done(ok=True)
    assert session.state is State.READY and done.events == ()


def test_self_decode_skipped_when_loaded_goes_to_next_entry():
    session = open_session(contract(low_rounds=1, fallback=(3, 2), self_load=50))
    done = run_round(session, (4,), 0, 6, load=60)
    assert done.verdict.action is Action.SWITCH


def test_transition_table_gives_one_known_next_state_per_state_and_input():
    for (state, event), target in TRANSITIONS.items():
        assert isinstance(state, State) and isinstance(event, Input) and isinstance(target, State)
    # Ended sessions move only when a newer epoch supersedes them (and refuse by problem type).
    assert {e for (s, e) in TRANSITIONS if s in (State.FINISHED, State.FAILED)} == {Input.PROPOSAL, Input.SUPERSEDE}
    assert not any(s is State.FENCED for s, _ in TRANSITIONS)


def test_verdict_is_the_wire_message():
    session = open_session()
    done = run_round(session, (4,), 1, 5)
    assert Verdict.decode(done.verdict.encode()) == done.verdict


def test_failed_append_undoes_the_control_step():
    session = open_session(contract(low_rounds=1, fallback=(1, 2)), m_init=8)
    p = proposal(session, (4, 5))
    session.receive_proposal(p, client=DRAFTER, now=0)
    session.complete_scoring(0, 6)
    assert (session.control.m_cap, session.control.j) == (4, 1)
    session.append_done(ok=False)
    assert session.control.snapshot() == (8, 0, 0, 0)
    session.receive_proposal(p, client=DRAFTER, now=0)
    session.complete_scoring(0, 6)
    done = session.append_done(ok=True)
    assert done.verdict.action is Action.REDUCE and done.verdict.m_cap == 4


def test_assignment_during_commit_survives_undo_and_switch():
    session = open_session(contract(low_rounds=1, fallback=(2,)), m_init=8)
    session.receive_proposal(proposal(session, (4,)), client=DRAFTER, now=0)
    session.complete_scoring(0, 6)
    session.assign(assignment(session, drafter="https://b/", m_init=3))
    session.append_done(ok=False)
    assert session.control.m_cap == 3 and session.drafter == "https://b/"
    p = proposal(session, (4,), drafter="https://b/")
    session.receive_proposal(p, client="https://b/", now=0)
    session.complete_scoring(0, 6)
    session.assign(assignment(session, drafter="https://c/"))
    done = session.append_done(ok=True)
    assert done.verdict.action is Action.SWITCH and not session.revoked
    assert isinstance(session.receive_proposal(proposal(session, (4,), drafter="https://c/"),
                                               client="https://c/", now=0), ScoreNeeded)


# -- defects an outside probe found --------------------------------------------------------

@pytest.mark.parametrize("rule", [1, 2])
def test_proposed_token_outside_the_vocabulary_is_bad_proposal_before_any_work(rule):
    """Defect (a): a token >= V never reaches the scorer, under either rule."""
    c = contract(rule=rule)
    session, _ = VerifierSession.open(
        SessionOpen(session=SID, epoch=1, contract=c, prompt=PROMPT, commit_log="l"),
        target_digest=TARGET, vocab=20)
    session.assign(assignment(session))
    with pytest.raises(BadProposal):
        session.receive_proposal(proposal(session, (4, 20)), client=DRAFTER, now=0)
    assert session.state is State.READY and session._current is None
    work = session.receive_proposal(proposal(session, (4, 19)), client=DRAFTER, now=0)
    assert isinstance(work, ScoreNeeded)
    if rule == 2:  # the session's V reads the raw rows when provide_q is given none
        assert session.provide_q(q_rows=q_bytes([[0.05] * 20, [0.05] * 20])) is not None


def test_open_checks_prompt_and_resumed_output_against_the_vocabulary():
    so = SessionOpen(session=SID, epoch=1, contract=contract(), prompt=PROMPT, commit_log="l")
    with pytest.raises(BadRequest):
        VerifierSession.open(so, target_digest=TARGET, vocab=13)  # the prompt holds 13
    with pytest.raises(BadRequest):
        VerifierSession.open(so, target_digest=TARGET, vocab=0)
    tokens = (5, 30)
    resumed = replace(so, epoch=2, resume=Resume(round=2, committed=2, digest=extend_digest(d0(), tokens),
                                                 committed_tokens="mlc://out"))
    with pytest.raises(BadRequest):
        VerifierSession.open(resumed, target_digest=TARGET, vocab=30, committed_tokens=tokens)
    session, _ = VerifierSession.open(resumed, target_digest=TARGET, vocab=31, committed_tokens=tokens)
    assert session.vocab == 31


def test_rule2_resume_at_the_last_uint32_round_is_refused_at_open():
    """Defect (b): round 2^32 has no uint32 for §6.4's derivation; rule 1 draws nothing."""
    tokens = (5,)
    for rule, last, refused in ((2, 2**32 - 1, True), (2, 2**32 + 5, True), (2, 2**32 - 2, False),
                                (1, 2**32 - 1, False)):
        c = contract(rule=rule, sampling=Sampling(seed=3))
        digest = extend_digest(prefix_digest(contract_digest(c), PROMPT), tokens)
        so = SessionOpen(session=SID, epoch=2, contract=c, prompt=PROMPT, commit_log="l",
                         resume=Resume(round=last, committed=1, digest=digest, committed_tokens="x"))
        if refused:
            with pytest.raises(BadRequest):
                VerifierSession.open(so, target_digest=TARGET, committed_tokens=tokens)
            continue
        session, _ = VerifierSession.open(so, target_digest=TARGET, committed_tokens=tokens)
        session.assign(assignment(session))
        done = run_round(session, (4,), 1, 6)
        assert done.verdict.round == last + 1 and session.state is State.READY


@pytest.mark.parametrize("seed", [None, 3])
def test_round_without_uint32_number_is_refused_without_leaving_the_state(seed):
    """Defect (b): the uniforms are drawn before the session changes state, so a round
    that cannot have them is refused and the session is not stuck in SCORING."""
    session = open_session(contract(rule=2, sampling=Sampling(seed=seed)))
    session.round = 2**32 - 1  # as if 2^32 - 1 rounds had been verified
    with pytest.raises(BadRequest):
        session.receive_proposal(proposal(session, (4,)), client=DRAFTER, now=0)
    assert session.state is State.READY and session._current is None
    sd = self_decoding_session(rule=2, sampling=Sampling(seed=seed))
    sd.round = 2**32 - 1
    with pytest.raises(BadRequest):
        sd.self_decode()
    assert sd.state is State.SELF_DECODING and sd._current is None


def test_authorization_uses_the_authenticated_peer_not_the_proposal_field():
    """§6.3 Authorization: the peer's base URI is compared with the assigned drafter; the
    proposal's own ``drafter`` member cannot stand in for it."""
    session = open_session(m_init=3)
    me = Peer(uri=DRAFTER, role=PeerRole.DRAFTER)
    impostor = Peer(uri="https://other/", role=PeerRole.DRAFTER)
    with pytest.raises(NotAssigned):
        session.receive_proposal(proposal(session, (4,)), client=impostor, now=0)
    with pytest.raises(NotAssigned):
        session.receive_proposal(proposal(session, (4,)), client=Peer(uri=None, role=PeerRole.DRAFTER), now=0)
    # Authorization comes before fencing (§6.3's order): a stranger learns nothing of the epoch.
    with pytest.raises(NotAssigned):
        session.receive_proposal(proposal(session, (4,), epoch=9), client=impostor, now=0)
    with pytest.raises(StaleEpoch):
        session.receive_proposal(proposal(session, (4,), epoch=9), client=me, now=0)
    # A trailing slash does not make another instance.
    slashless = Peer(uri=DRAFTER.rstrip("/"), role=PeerRole.DRAFTER)
    assert isinstance(session.receive_proposal(proposal(session, (4,)), client=slashless, now=0), ScoreNeeded)
