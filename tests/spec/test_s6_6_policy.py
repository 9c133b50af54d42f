"""Conformance: §6.6 Sampling Policy Updates."""

from __future__ import annotations

import pytest

from sdcp_fast.protocol.messages import Policy, Sampling, SessionOpen, Status
from sdcp_fast.protocol.problems import BadRequest
from sdcp_fast.protocol.routing import RoutedSession, assign, policy_update
from sdcp_fast.protocol.session import ScoreNeeded
from sdcp_fast.protocol.status_table import StatusTable
from tests.spec.s6kit import DRAFTER, PROMPT, SID, VERIFIER, contract, open_session, proposal, run_round


def test_policy_from_round_must_exceed_current_round() -> None:
    """§6.6: the router sends a policy with from_round greater than the current round."""
    session = open_session()
    run_round(session, (1,), 1, 1)
    for from_round in (0, 1):
        with pytest.raises(BadRequest):
            session.policy(Policy(session=SID, from_round=from_round, sampling=Sampling(top_k=1)))
    session.policy(Policy(session=SID, from_round=2, sampling=Sampling(top_k=1)))


def test_new_profile_applies_to_rounds_from_from_round_on() -> None:
    """§6.6: the verifier applies the new profile to rounds numbered from_round and later."""
    base = Sampling(temperature_milli=900)
    session = open_session(contract(sampling=base))
    session.policy(Policy(session=SID, from_round=3, sampling=Sampling(temperature_milli=0)))
    profiles = []
    for _ in range(4):
        work = session.receive_proposal(proposal(session, (1,)), client=DRAFTER, now=0)
        assert isinstance(work, ScoreNeeded)
        profiles.append(work.sampling)
        session.complete_scoring(1, 1)
        session.append_done(ok=True)
    assert profiles == [base, base, Sampling(temperature_milli=0), Sampling(temperature_milli=0)]


def test_rule_and_contract_never_change_and_committed_output_is_kept() -> None:
    """§6.6: the acceptance rule cannot be changed, the contract is unchanged, and committed output
    is never changed by a policy update."""
    session = open_session(contract(rule=1))
    run_round(session, (1, 3), 2, 4)
    before = (session.contract, session.output(0).tokens, session.digest)
    session.policy(Policy(session=SID, from_round=2, sampling=Sampling(temperature_milli=1500, top_k=2)))
    assert (session.contract, session.output(0).tokens, session.digest) == before
    work = session.receive_proposal(proposal(session, (1,)), client=DRAFTER, now=0)
    assert work.rule == 1


def test_router_carries_updated_profile_in_later_assignments() -> None:
    """§6.6: the router includes the new profile in the "sampling" member of subsequent
    assignments; the contract in those assignments is unchanged."""
    table = StatusTable()
    table.report(Status(instance=DRAFTER, role=1, load=0, queue=0, ttl_ms=1000), 0.0)
    opened = SessionOpen(session=SID, epoch=1, contract=contract(), prompt=PROMPT, commit_log="l")
    routed = RoutedSession(opened=opened, epoch=1, verifier=VERIFIER, m_init=2)
    policy_update(routed, 1, Sampling(top_p_milli=900))
    a = assign(routed, table, 0.0)
    assert a is not None and a.sampling == Sampling(top_p_milli=900) and a.contract == contract()
