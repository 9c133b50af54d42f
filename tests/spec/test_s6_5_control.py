"""Conformance: §6.5 Speculation Control and Escalation."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sdcp_fast.protocol.control import SpeculationControl, is_low
from sdcp_fast.protocol.messages import Action, Contract
from sdcp_fast.protocol.problems import BadContract, NotAssigned, SessionClosed
from sdcp_fast.protocol.session import State
from tests.spec.s6kit import DRAFTER, assignment, contract, open_session, proposal, run_round


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 16), st.lists(st.tuples(st.integers(0, 16), st.integers(0, 100)), max_size=30))
def test_verdict_m_cap_between_one_and_m_max(m_max: int, rounds: list[tuple[int, int]]) -> None:
    """§6.5.1: each verdict carries m_cap with 1 <= m_cap <= m_max."""
    session = open_session(contract(m_max=m_max, stop=(), max_new=10_000, low_rounds=1, fallback=(1,) * 40),
                           m_init=m_max)
    for accepted, load in rounds:
        m = session.control.limit()
        done = run_round(session, (1,) * m, min(accepted, m), 1, load=load)
        assert 1 <= done.verdict.m_cap <= m_max


def test_verifier_lowers_m_cap_under_load() -> None:
    """§6.5.1: the verifier lowers m_cap when its own load makes long proposals costly."""
    session = open_session(contract(m_max=8), m_init=8)
    assert run_round(session, (1,) * 8, 8, 1, load=10).verdict.m_cap == 8
    assert run_round(session, (1,) * 8, 8, 1, load=95).verdict.m_cap < 8


def test_m_cap_restored_gradually() -> None:
    """§6.5.1 (SHOULD): restore m_cap gradually, by one per round, when rounds are no longer low
    and load permits."""
    session = open_session(contract(m_max=8, low_rounds=1, fallback=(1, 1)), m_init=8)
    assert run_round(session, (1,) * 8, 0, 1).verdict.m_cap == 4
    caps = [run_round(session, (1,) * session.control.limit(), 1, 1).verdict.m_cap for _ in range(5)]
    assert caps == [5, 6, 7, 8, 8]


def test_m_cap_does_not_grow_while_rounds_are_low() -> None:
    """§6.5.1: m_cap is restored "when rounds are no longer low": a low round that applies no
    ladder entry leaves m_cap as it is, even with the load far below the knee."""
    session = open_session(contract(m_max=8, low_rounds=3, fallback=(5,)), m_init=3)
    for _ in range(2):
        done = run_round(session, (1, 1), 0, 1, load=0)
        assert done.verdict.action is Action.CONTINUE and done.verdict.m_cap == 3
    assert run_round(session, (1, 1), 2, 1, load=0).verdict.m_cap == 4


def test_low_round_definition() -> None:
    """§6.5.2: a round is low if 100 * a < low_ratio * M, or, when low_ratio is zero or absent,
    if a = 0."""
    assert is_low(1, 4, 30) and not is_low(2, 4, 50) and is_low(0, 4, None) and not is_low(1, 4, 0)


def test_counters_and_fallback_ladder() -> None:
    """§6.5.2: c counts consecutive low rounds, g the others; when c reaches R the verifier applies
    entry j, advancing j, and resets c; otherwise it applies continue; with no entry left, fail."""
    session = open_session(contract(low_rounds=2, fallback=(1, 2)), m_init=8)
    actions = []
    for _ in range(4):
        done = run_round(session, (1, 1), 0, 1)
        actions.append((done.verdict.action, done.verdict.low))
    assert actions == [(Action.CONTINUE, 1), (Action.REDUCE, 2), (Action.CONTINUE, 1), (Action.SWITCH, 2)]
    ctl = SpeculationControl(contract(low_rounds=1, fallback=(1,)))
    assert [ctl.after_round(0, 2, 0).action for _ in range(2)] == [Action.REDUCE, Action.FAIL]


def test_j_resets_after_r_rounds_that_are_not_low() -> None:
    """§6.5.2: after a round that is not low, c is reset and g incremented; when g reaches R,
    j is reset to zero."""
    ctl = SpeculationControl(contract(low_rounds=2, fallback=(1, 2)))
    for accepted in (0, 0, 2):
        ctl.after_round(accepted, 2, 0)
    assert (ctl.c, ctl.g, ctl.j) == (0, 1, 1)
    ctl.after_round(2, 2, 0)
    assert ctl.j == 0


def test_self_decode_skipped_when_not_permitted_and_j_advances_past_it() -> None:
    """§6.5.2: self_decode is permitted only if the contract has self_load and the load does not
    exceed it; otherwise it is skipped, the next entry applied, and j advances past both."""
    for c, load in ((contract(low_rounds=1, fallback=(3, 2)), 0),
                    (contract(low_rounds=1, fallback=(3, 2), self_load=40), 41)):
        ctl = SpeculationControl(c)
        assert ctl.after_round(0, 2, load).action is Action.SWITCH and ctl.j == 2
    ctl = SpeculationControl(contract(low_rounds=1, fallback=(3, 2), self_load=40))
    assert ctl.after_round(0, 2, 40).action is Action.SELF_DECODE and ctl.j == 1


def test_fallback_list_holds_only_ladder_actions() -> None:
    """§6.5.2: the fallback list MUST contain only reduce, switch, self_decode and fail."""
    raw = contract().to_map()
    for bad in ([0], [1, 4]):
        with pytest.raises(BadContract):
            Contract.from_map({**raw, "fallback": bad})


def test_j_persists_across_drafter_change_and_self_decoding() -> None:
    """§6.5.2: j persists across a change of drafter and across a self-decoding period."""
    session = open_session(contract(low_rounds=1, fallback=(3, 2, 5), self_load=50, self_max=1))
    assert run_round(session, (1,), 0, 1).verdict.action is Action.SELF_DECODE
    session.self_decode()
    session.complete_scoring(0, 7)
    session.append_done(ok=True)
    session.assign(assignment(session, drafter="https://b/"))
    assert session.control.j == 1
    # The next low round applies entry j = 1 (switch), not entry 0 again.
    done = run_round(session, (1,), 0, 1, client="https://b/")
    assert done.verdict.action is Action.SWITCH and session.control.j == 2


def test_switch_sends_event_and_current_drafter_stops() -> None:
    """§6.5.2 switch: the verifier sends an event to the router; the current drafter MUST stop
    proposing for the session."""
    session = open_session(contract(low_rounds=1, fallback=(2,)))
    done = run_round(session, (1,), 0, 1)
    assert done.verdict.action is Action.SWITCH
    assert [(e.kind, e.committed, e.digest) for e in done.events] == [(Action.SWITCH, 1, session.digest)]
    with pytest.raises(NotAssigned):
        session.receive_proposal(proposal(session, (1,)), client=DRAFTER, now=0)


def test_drafter_stops_proposing_on_switch() -> None:
    """§6.5.2 switch, the drafter's side: after a switch verdict the current drafter MUST stop
    proposing for the session; only a new assignment lets a drafter propose again."""
    from sdcp_fast.protocol.drafting import DrafterError, DrafterSession
    from tests.spec.s6kit import STATUS

    verifier = open_session(contract(low_rounds=1, fallback=(2,)))
    drafter = DrafterSession(assignment(verifier))
    prop = drafter.propose([1], STATUS)
    verifier.receive_proposal(prop, client=DRAFTER, now=0)
    verifier.complete_scoring(0, 1)
    verdict = verifier.append_done(ok=True).verdict
    outcome = drafter.on_verdict(verdict)
    assert verdict.action is Action.SWITCH and not outcome.proceed and drafter.stopped is Action.SWITCH
    with pytest.raises(DrafterError):
        drafter.propose([1], STATUS)
    verifier.assign(assignment(verifier, drafter="https://b/"))
    successor = DrafterSession(assignment(verifier, drafter="https://b/"))
    assert successor.propose([1], STATUS).round == verdict.round + 1


def test_self_decoding_rounds_and_its_end() -> None:
    """§6.5.2 self_decode: each token is a round of its own with no proposal, round numbers stay
    consecutive; it stops after self_max tokens or when the load exceeds self_load, then an event
    asks the router for a drafter."""
    session = open_session(contract(low_rounds=1, fallback=(3,), self_load=50, self_max=2))
    run_round(session, (1,), 0, 4)
    assert session.state is State.SELF_DECODING
    rounds = []
    for token in (5, 6):
        work = session.self_decode()
        assert work.proposed == () and work.self_decoded
        session.complete_scoring(0, token)
        done = session.append_done(ok=True)
        rounds.append(done.verdict.round)
        assert done.tokens == (token,) and session.output(0).tokens[-1] == token
    assert rounds == [2, 3] and session.state is State.READY
    assert [e.kind for e in done.events] == [Action.SELF_DECODE]
    session = open_session(contract(low_rounds=1, fallback=(3,), self_load=50))
    run_round(session, (1,), 0, 4)
    session.self_decode()
    session.complete_scoring(0, 5, load=51)
    assert session.append_done(ok=True).events[0].kind is Action.SELF_DECODE


def test_finish_and_fail_end_the_session() -> None:
    """§6.5.2: finish ends generation (stop token or max_new); fail ends the session with an error."""
    session = open_session(contract(stop=(3,)))
    assert run_round(session, (3,), 1, 1).verdict.action is Action.FINISH
    with pytest.raises(SessionClosed) as info:
        session.receive_proposal(proposal(session, (1,)), client=DRAFTER, now=0)
    assert info.value.status == 410
    session = open_session(contract(low_rounds=1, fallback=(5,)))
    assert run_round(session, (1,), 0, 1).verdict.action is Action.FAIL
    assert session.state is State.FAILED and session.output(0).finish is Action.FAIL
