"""Drafter-side logic (sdcp_fast/protocol/drafting.py, draft §6.2)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sdcp_fast.protocol.drafting import (
    AcceptanceEstimator,
    DrafterError,
    DrafterSession,
    choose_m,
    expected_tokens,
    state_from_problem,
)
from sdcp_fast.protocol.messages import Action, Assignment, Proposal
from sdcp_fast.protocol.problems import (
    BadProposal,
    Limit,
    NotAssigned,
    QUnavailable,
    StaleBase,
    StaleEpoch,
)
from sdcp_fast.protocol.session import ScoreNeeded
from tests.protocol.sessionkit import DRAFTER, STATUS, VERIFIER, assignment, open_session, proposal, run_round


def test_expected_tokens():
    assert expected_tokens(1.0, 4) == 5.0
    assert expected_tokens(0.0, 4) == 1.0
    assert expected_tokens(0.5, 2) == pytest.approx(1.75)
    assert expected_tokens(-0.5, 3) == 1.0


def _brute(alpha, t_d, t_v, limit):
    rates = [expected_tokens(alpha, m) / (m * t_d + t_v) for m in range(1, limit + 1)]
    return 1 + rates.index(max(rates))


@given(st.floats(0, 1), st.floats(0.01, 10), st.floats(0.01, 100), st.integers(1, 64))
def test_choose_m_maximizes_tokens_per_time(alpha, t_d, t_v, limit):
    assert choose_m(alpha, t_d, t_v, limit) == _brute(alpha, t_d, t_v, limit)


def test_choose_m_responds_to_load_and_acceptance():
    assert choose_m(1.0, 1.0, 10.0, 8) == 8
    assert choose_m(0.0, 1.0, 10.0, 8) == 1
    assert choose_m(0.8, 1.0, 10.0, 16) > choose_m(0.8, 5.0, 10.0, 16)  # slow drafting -> fewer
    assert choose_m(0.5, 0.0, 0.0, 7) == 7
    with pytest.raises(ValueError):
        choose_m(0.5, 1.0, 1.0, 0)


def test_estimator_tracks_per_token_acceptance():
    est = AcceptanceEstimator(decay=0.9, prior=0.5)
    for _ in range(200):
        est.update(3, 4)  # 3 successes, 1 failure
    assert est.alpha == pytest.approx(0.75, abs=1e-3)
    assert est.accept_milli == 750
    for _ in range(200):
        est.update(4, 4)
    assert est.alpha > 0.99 and est.accept_milli == 1000
    with pytest.raises(ValueError):
        est.update(5, 4)
    with pytest.raises(ValueError):
        AcceptanceEstimator(decay=1.0)
    zero = AcceptanceEstimator(prior_weight=0.0)
    assert zero.alpha == 0.0


def _pair(**contract_overrides):
    from tests.protocol.sessionkit import contract

    verifier = open_session(contract(**contract_overrides), m_init=3)
    drafter = DrafterSession(assignment(verifier, m_init=3))
    return verifier, drafter


def _verify(verifier, prop, accepted, next_token):
    work = verifier.receive_proposal(prop, client=DRAFTER, now=0)
    assert isinstance(work, ScoreNeeded)
    verifier.complete_scoring(accepted, next_token)
    return verifier.append_done(ok=True).verdict


def test_one_outstanding_proposal_and_bookkeeping():
    verifier, drafter = _pair()
    assert drafter.limit == 3 and drafter.choose_m(0.1, 1.0) >= 1
    prop = drafter.propose([4, 5], STATUS)
    assert isinstance(prop, Proposal) and (prop.round, prop.base, prop.base_digest) == (1, 0, verifier.digest)
    with pytest.raises(DrafterError):
        drafter.propose([6], STATUS)
    assert drafter.retry() is prop
    assert drafter.retry(replace(STATUS, load=50)).status.load == 50
    verdict = _verify(verifier, prop, 2, 7)
    outcome = drafter.on_verdict(verdict, assumed=(4, 5, 7))
    assert outcome.proceed and outcome.full and outcome.speculation_ok
    assert (drafter.round, drafter.committed, drafter.digest) == (1, 3, verifier.digest)
    prop2 = drafter.propose([8], STATUS)
    verdict = _verify(verifier, prop2, 0, 9)
    outcome = drafter.on_verdict(verdict, assumed=(8, 1))
    assert outcome.proceed and not outcome.full and not outcome.speculation_ok
    with pytest.raises(DrafterError):
        drafter.on_verdict(verdict)
    with pytest.raises(DrafterError):
        drafter.retry()


def test_speculation_not_ok_when_extra_token_differs():
    verifier, drafter = _pair()
    verdict = _verify(verifier, drafter.propose([4, 5], STATUS), 2, 7)
    assert not drafter.on_verdict(verdict, assumed=(4, 5, 8)).speculation_ok


def test_propose_limits():
    _, drafter = _pair()
    with pytest.raises(DrafterError):
        drafter.propose([], STATUS)
    with pytest.raises(DrafterError):
        drafter.propose([1, 2, 3, 4], STATUS)


def test_stop_actions_end_proposing():
    verifier, drafter = _pair(low_rounds=1, fallback=(2,))
    verdict = _verify(verifier, drafter.propose([4], STATUS), 0, 7)
    outcome = drafter.on_verdict(verdict)
    assert verdict.action is Action.SWITCH and not outcome.proceed and drafter.stopped is Action.SWITCH
    with pytest.raises(DrafterError):
        drafter.propose([1], STATUS)


def test_resync_from_stale_base_problem():
    verifier, first = _pair()
    run_round(verifier, (4,), 1, 5)
    # An assignment that lags the verifier: right round, outdated committed prefix.
    drafter = DrafterSession(replace(assignment(verifier), committed=0, digest=first.digest))
    prop = drafter.propose([6], STATUS)
    with pytest.raises(StaleBase) as info:
        verifier.receive_proposal(prop, client=DRAFTER, now=0)
    assert drafter.on_problem(info.value)
    assert (drafter.round, drafter.committed, drafter.digest) == (1, 2, verifier.digest)
    assert drafter.outstanding is None
    prop = drafter.propose([6], STATUS)
    assert isinstance(verifier.receive_proposal(prop, client=DRAFTER, now=0), ScoreNeeded)


def test_lost_verdict_retry_gets_recorded_verdict():
    verifier, drafter = _pair()
    prop = drafter.propose([4], STATUS)
    lost = _verify(verifier, prop, 1, 5)
    assert verifier.receive_proposal(drafter.retry(), client=DRAFTER, now=0) == lost


def test_state_from_problem_reads_json_hex_and_rejects_garbage():
    verifier, _ = _pair()
    state = verifier.session_state()
    as_json = {k: v.hex() if isinstance(v, bytes) else v for k, v in state.to_map().items()}
    assert state_from_problem(StaleBase(extra={"session_state": as_json})) == state
    assert state_from_problem(StaleBase(extra={"session_state": state})) == state
    assert state_from_problem(StaleBase()) is None
    assert state_from_problem(StaleBase(extra={"session_state": {"session": "zz"}})) is None
    assert state_from_problem(StaleBase(extra={"session_state": {"round": 1}})) is None


def test_on_problem_outcomes():
    verifier, drafter = _pair()
    for problem in (Limit(), BadProposal(), QUnavailable(), StaleBase()):
        drafter.propose([1], STATUS)
        assert drafter.on_problem(problem) and drafter.outstanding is None
    drafter.propose([1], STATUS)
    assert not drafter.on_problem(StaleEpoch()) and drafter.stopped is Action.FAIL
    _, other = _pair()
    assert not other.on_problem(NotAssigned())
    with pytest.raises(DrafterError):
        other.resync(replace(verifier.session_state(), session=b"x" * 16))


def test_assignment_fields_used():
    verifier, _ = _pair()
    a = assignment(verifier)
    assert isinstance(a, Assignment) and a.verifier == VERIFIER
    assert not math.isnan(DrafterSession(a).estimator.alpha)


def _toy_argmax(context):
    import hashlib

    digest = hashlib.sha256(repr(tuple(context)).encode()).digest()
    row = list(digest[:6])
    return row.index(max(row))


@given(st.lists(st.tuples(st.lists(st.integers(0, 5), min_size=1, max_size=4),
                          st.sampled_from(["ok", "lost", "append-failed"])), min_size=1, max_size=25))
def test_drafter_and_verifier_agree_through_lost_verdicts_and_failed_appends(steps):
    """Rule 1 end to end: whatever is proposed and whatever is lost or retried, the output is
    greedy decoding and the drafter's base follows the verifier's."""
    from tests.protocol.sessionkit import contract

    verifier = open_session(contract(stop=(), max_new=200, low_rounds=1000), m_init=4)
    drafter = DrafterSession(assignment(verifier, m_init=4))
    for tokens, fate in steps:
        prop = drafter.propose(tokens[: drafter.limit], STATUS)
        while True:
            work = verifier.receive_proposal(prop, client=DRAFTER, now=0)
            if not isinstance(work, ScoreNeeded):
                break  # the recorded verdict of a retried round
            context = list(work.context)
            accepted = 0
            for x in work.proposed:
                if x != _toy_argmax(context):
                    break
                context.append(x)
                accepted += 1
            verifier.complete_scoring(accepted, _toy_argmax(context))
            if fate == "append-failed":
                verifier.append_done(ok=False)
                fate = "ok"  # the drafter's retry goes through
                continue
            work = verifier.append_done(ok=True).verdict
            if fate == "lost":
                fate = "ok"
                prop = drafter.retry()
                continue
            break
        drafter.on_verdict(work)
        assert (drafter.round, drafter.committed, drafter.digest) == (verifier.round, verifier.committed,
                                                                       verifier.digest)
    out = list(verifier.output(0).tokens)
    context = list(verifier.prompt)
    for token in out:
        assert token == _toy_argmax(context)
        context.append(token)


def test_malformed_verdict_is_bad_request_and_changes_nothing():
    """Defect (c): on_verdict validates the whole verdict against the outstanding proposal
    before adopting any of it, and refuses with the project's problem, not a bare ValueError."""
    from sdcp_fast.protocol.digests import extend_digest
    from sdcp_fast.protocol.problems import BadRequest

    verifier, drafter = _pair(stop=(9,), max_new=50)
    prop = drafter.propose([4, 5], STATUS)
    good = _verify(verifier, prop, 1, 7)  # emits (4, 7)
    base = prop.base_digest

    def chained(emitted, **fields):
        return replace(good, emitted=emitted, committed=len(emitted), digest=extend_digest(base, emitted),
                       **fields)

    bad = [
        replace(good, accepted=3),  # accepted > M
        chained((4, 5, 7, 8), accepted=2),  # more than accepted + 1
        chained(()),  # nothing emitted
        chained((5, 7)),  # not the accepted proposed token
        chained((4,)),  # truncated, yet the session goes on
        replace(good, committed=good.committed + 1),
        replace(good, digest=bytes(32)),
        replace(good, epoch=2),
        replace(good, m_cap=drafter.assignment.contract.m_max + 1),
    ]
    before = (drafter.round, drafter.committed, drafter.digest, drafter.m_cap, drafter.estimator.alpha,
              drafter.outstanding, drafter.stopped)
    for verdict in bad:
        with pytest.raises(BadRequest):
            drafter.on_verdict(verdict)
        assert (drafter.round, drafter.committed, drafter.digest, drafter.m_cap, drafter.estimator.alpha,
                drafter.outstanding, drafter.stopped) == before
    assert drafter.on_verdict(good).proceed and drafter.committed == 2
    # Emitted tokens truncated at a stop token come with finish, and are taken.
    verifier, drafter = _pair(stop=(5,))
    verdict = _verify(verifier, drafter.propose([5, 6], STATUS), 2, 7)
    assert verdict.emitted == (5,) and verdict.action is Action.FINISH
    assert not drafter.on_verdict(verdict).proceed and drafter.committed == 1


def test_recorded_verdict_of_another_request_resynchronizes_through_on_problem():
    """A drafter assigned while a round was in flight proposes that round again. The verifier
    answers the stale base with its session-state, not the round's recorded verdict, which
    answered another request decided before this assignment (docs/interpretations.md,
    "Idempotency"); a drafter that got such a verdict anyway refuses it in on_verdict, changes
    nothing, and resyncs from the session-state its problem carries."""
    from sdcp_fast.protocol.problems import BadRequest, StaleBase

    verifier, _ = _pair()
    lagging = assignment(verifier, drafter="https://b/", m_init=3)  # built before round 1 commits
    prop_a = proposal(verifier, (4, 5))
    verdict_a = _verify(verifier, prop_a, 2, 6)
    verifier.assign(lagging)
    b = DrafterSession(lagging)
    prop_b = b.propose([7, 8], STATUS)
    with pytest.raises(StaleBase) as stale:
        verifier.receive_proposal(prop_b, client="https://b/", now=0)
    assert stale.value.extra["session_state"]["round"] == 1
    with pytest.raises(BadRequest) as info:
        b.on_verdict(verdict_a)
    assert (b.round, b.committed, b.outstanding) == (0, 0, prop_b)
    assert b.on_problem(info.value) and (b.round, b.committed, b.digest) == (1, 3, verifier.digest)
    assert b.propose([9], STATUS).round == 2
    # A malformed verdict carries no state: the drafter stops, as for any other bad request.
    c = DrafterSession(assignment(verifier, drafter="https://b/"))
    c.propose([1], STATUS)
    assert not c.on_problem(BadRequest("garbage")) and c.stopped is Action.FAIL
