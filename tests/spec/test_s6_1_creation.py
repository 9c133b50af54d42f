"""Conformance: §6.1 Session Creation and Assignment."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sdcp_fast.protocol.contract import contract_digest
from sdcp_fast.protocol.digests import prefix_digest
from sdcp_fast.protocol.messages import SessionOpen, Status
from sdcp_fast.protocol.problems import BadContract, NotAssigned
from sdcp_fast.protocol.routing import RoutedSession, assign
from sdcp_fast.protocol.session import ScoreNeeded, VerifierSession
from sdcp_fast.protocol.status_table import StatusTable, choose_drafter
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
)

OPEN = SessionOpen(session=SID, epoch=1, contract=contract(), prompt=PROMPT, commit_log="mlc://log")


def test_verifier_refuses_contract_whose_target_does_not_match_its_model() -> None:
    """§6.1: the verifier MUST refuse a contract whose target digest does not match its model."""
    with pytest.raises(BadContract) as info:
        VerifierSession.open(OPEN, target_digest=bytes(32))
    assert info.value.suffix == "sdcp-bad-contract" and info.value.status == 422


def test_verifier_answers_session_state_round_zero_committed_zero_with_d0() -> None:
    """§6.1: the verifier computes d[0] and answers with session-state (round 0, committed 0)."""
    _, state = VerifierSession.open(OPEN, target_digest=TARGET)
    assert (state.session, state.epoch, state.round, state.committed) == (SID, 1, 0, 0)
    assert state.digest == prefix_digest(contract_digest(OPEN.contract), PROMPT)


def test_verifier_accepts_proposals_only_from_the_drafter_of_the_latest_assignment() -> None:
    """§6.1: the verifier accepts proposals only from the drafter named in the latest assignment."""
    session = open_session()
    session.assign(assignment(session, drafter="https://b.example/"))
    with pytest.raises(NotAssigned):
        session.receive_proposal(proposal(session, (4,)), client=DRAFTER, now=0)
    mine = replace(proposal(session, (4,)), drafter="https://b.example/")
    assert isinstance(session.receive_proposal(mine, client="https://b.example/", now=0), ScoreNeeded)


def test_router_never_assigns_to_an_instance_whose_status_expired() -> None:
    """§6.1: the router MUST NOT assign sessions to an instance whose status has expired."""
    table = StatusTable()
    table.report(Status(instance="https://old/", role=1, load=0, queue=0, ttl_ms=100), now=0.0)
    table.report(Status(instance="https://busy/", role=1, load=99, queue=9, ttl_ms=10_000), now=0.0)
    assert choose_drafter(table, contract(), now=0.05) == "https://old/"
    assert choose_drafter(table, contract(), now=0.1) == "https://busy/"
    table.expire(20.0)
    opened = SessionOpen(session=SID, epoch=1, contract=contract(), prompt=PROMPT, commit_log="l")
    routed = RoutedSession(opened=opened, epoch=1, verifier=VERIFIER, m_init=1)
    assert assign(routed, table, 20.0) is None


def test_router_selects_a_drafter_whose_model_the_contract_permits() -> None:
    """§6.1: the router selects a drafter whose model is permitted by the contract."""
    table = StatusTable()
    for name, model, load in (("https://a/", b"A" * 32, 0), ("https://b/", b"B" * 32, 90)):
        table.report(Status(instance=name, role=1, load=load, queue=0, ttl_ms=1000), now=0.0)
        table.register_model(name, model)
    assert choose_drafter(table, contract(drafters=(b"B" * 32,)), 0.0) == "https://b/"
    assert choose_drafter(table, contract(), 0.0) == "https://a/"  # absent: any model


def test_session_open_is_idempotent_and_unknown_sessions_are_404() -> None:
    """§6.1 POST sessions (and §6.9 lost messages): the same session-open twice answers the
    same session's current state and resets nothing; an id the verifier does not hold is
    sdcp-unknown-session (404)."""
    from sdcp_fast.protocol.problems import UnknownSession
    from sdcp_fast.protocol.registry import SessionRegistry

    registry = SessionRegistry()
    session, _ = registry.open(OPEN, target_digest=TARGET)
    session.assign(assignment(session))
    work = session.receive_proposal(proposal(session, (4,)), client=DRAFTER, now=0)
    assert isinstance(work, ScoreNeeded)
    session.complete_scoring(1, 5)
    session.append_done(ok=True)
    again, state = registry.open(OPEN, target_digest=TARGET)
    assert again is session and (state.round, state.committed) == (1, 2) and again.drafter == DRAFTER
    with pytest.raises(UnknownSession) as info:
        registry.get(b"\x00" * 16)
    assert info.value.status == 404


def test_router_chooses_a_live_verifier_and_a_random_session_id() -> None:
    """§6.1: the router selects a verifier (local policy: least load, then queue, then name,
    among verifiers whose status is live) and sends session-open with epoch 1; the session id
    comes from the caller's random bytes, not from a fixed value."""
    import os

    from sdcp_fast.protocol.routing import new_session_id, open_message
    from sdcp_fast.protocol.status_table import choose_verifier

    table = StatusTable()
    table.report(Status(instance="https://v1/", role=2, load=40, queue=0, ttl_ms=1000), 0.0)
    table.report(Status(instance="https://v2/", role=2, load=10, queue=5, ttl_ms=1000), 0.0)
    table.report(Status(instance="https://d/", role=1, load=0, queue=0, ttl_ms=1000), 0.0)
    assert choose_verifier(table, 0.5) == "https://v2/"
    assert choose_verifier(table, 1.0) is None  # expired: never chosen
    ids = {new_session_id(os.urandom(16)) for _ in range(4)}
    assert len(ids) == 4
    opened = SessionOpen(session=ids.pop(), epoch=1, contract=contract(), prompt=PROMPT, commit_log="mlc://log")
    routed = RoutedSession(opened=opened, epoch=1, verifier="https://v2/", m_init=4)
    assert open_message(routed).epoch == 1
