"""Sessions without a drafter: the verifier may decode them itself (a local policy within
§6.5.2's condition on self_load; docs/interpretations.md, "Sessions without a drafter")."""

from __future__ import annotations

import pytest

from sdcp_fast.protocol import Action, RoundDone, State
from sdcp_fast.protocol.session import InvalidTransition
from tests.protocol.sessionkit import assignment, contract, open_session, run_round


def test_an_unassigned_session_self_decodes_when_the_contract_permits_it() -> None:
    session = open_session(contract(self_load=50, self_max=2), drafter=None)
    assert not session.begin_self_decoding(load=51)  # above self_load: not permitted
    assert session.state is State.READY
    assert session.begin_self_decoding(load=50)
    assert session.state is State.SELF_DECODING
    work = session.self_decode()
    assert work.proposed == () and work.self_decoded
    session.complete_scoring(0, 7, load=50)
    done = session.append_done(ok=True)
    assert isinstance(done, RoundDone) and done.verdict.round == 1 and done.tokens == (7,)
    session.self_decode()
    session.complete_scoring(0, 8, load=50)
    done = session.append_done(ok=True)
    # self_max ends the period as an escalated one ends: the router is asked for a drafter.
    assert isinstance(done, RoundDone) and [e.kind for e in done.events] == [Action.SELF_DECODE]
    assert session.state is State.READY


def test_no_self_decoding_without_self_load_or_with_a_serving_drafter() -> None:
    assert not open_session(contract(), drafter=None).begin_self_decoding(load=0)
    session = open_session(contract(self_load=100))
    assert not session.begin_self_decoding(load=0)  # its drafter is serving it
    assert session.state is State.READY


def test_an_assignment_ends_the_period() -> None:
    session = open_session(contract(self_load=100), drafter=None)
    assert session.begin_self_decoding(load=0)
    session.assign(assignment(session))
    assert session.state is State.READY
    run_round(session, [3, 4], 2, 5)  # the drafter's proposals are taken again
    assert session.committed == 3


def test_only_a_ready_session_can_begin() -> None:
    session = open_session(contract(self_load=100), drafter=None)
    session.begin_self_decoding(load=0)
    session.self_decode()
    with pytest.raises(InvalidTransition):
        session.begin_self_decoding(load=0)
