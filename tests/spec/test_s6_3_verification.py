"""Conformance: §6.3 Verification and Commit."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sdcp_fast.protocol import randoms
from sdcp_fast.protocol.drafting import DrafterSession
from sdcp_fast.protocol.messages import Action, Sampling
from sdcp_fast.protocol.problems import (
    BadProposal,
    NotAssigned,
    QUnavailable,
    StaleBase,
    StaleEpoch,
)
from sdcp_fast.protocol.session import Discarded, Pending, RoundDone, ScoreNeeded, State
from tests.spec.s6kit import (
    DRAFTER,
    PROMPT,
    SID,
    STATUS,
    TARGET,
    assignment,
    contract,
    open_session,
    proposal,
    run_round,
)


def test_authorization_client_must_be_the_assigned_drafter() -> None:
    """§6.3: the authenticated client MUST be the drafter named in the latest assignment;
    otherwise 403 sdcp-not-assigned."""
    session = open_session()
    with pytest.raises(NotAssigned) as info:
        session.receive_proposal(proposal(session, (4,)), client="https://mallory/", now=0)
    assert info.value.status == 403 and info.value.suffix == "sdcp-not-assigned"


def test_fencing_epoch_must_be_the_session_epoch() -> None:
    """§6.3: if epoch differs from the session epoch, respond 409 sdcp-stale-epoch."""
    session = open_session(epoch=2)
    for epoch in (1, 3):
        with pytest.raises(StaleEpoch) as info:
            session.receive_proposal(proposal(session, (4,), epoch=epoch), client=DRAFTER, now=0)
        assert info.value.status == 409 and info.value.suffix == "sdcp-stale-epoch"


def test_idempotency_existing_verdict_is_returned_unchanged() -> None:
    """§6.3: if a verdict for this round already exists, return it unchanged."""
    session = open_session()
    p = proposal(session, (4, 5))
    done = run_round(session, (4, 5), 1, 8)
    run_round(session, (9,), 1, 9)
    assert session.receive_proposal(p, client=DRAFTER, now=0) == done.verdict


def test_idempotency_identical_request_in_progress_waits_for_that_verdict() -> None:
    """§6.3: if the round is being verified for an identical earlier request, wait for that
    verdict and return it."""
    session = open_session()
    p = proposal(session, (4, 5))
    assert isinstance(session.receive_proposal(p, client=DRAFTER, now=0), ScoreNeeded)
    assert session.receive_proposal(p, client=DRAFTER, now=0) == Pending(1)
    session.complete_scoring(2, 6)
    done = session.append_done(ok=True)
    assert session.receive_proposal(p, client=DRAFTER, now=0) == done.verdict


def test_base_check_stale_base_carries_current_session_state() -> None:
    """§6.3: base not the committed length or base_digest not d[base], or round not the last
    round plus one: 409 sdcp-stale-base with the current session-state."""
    session = open_session()
    run_round(session, (4,), 1, 5)
    good = proposal(session, (6,))
    for bad in (replace(good, base=1), replace(good, base_digest=bytes(32)), replace(good, round=3)):
        with pytest.raises(StaleBase) as info:
            session.receive_proposal(bad, client=DRAFTER, now=0)
        assert info.value.status == 409
        state = info.value.extra["session_state"]
        assert (state["round"], state["committed"], state["digest"]) == (1, 2, session.digest)


def test_rule_preconditions_before_any_random_value(monkeypatch: pytest.MonkeyPatch) -> None:
    """§6.3: for a rule that needs draft probabilities the verifier MUST have obtained the rows
    for every position and checked q[i](x[i]) != 0 before drawing any random value."""
    drawn: list[tuple[int, int, int]] = []
    real, real_round = randoms.VerifierRandom.uniform, randoms.VerifierRandom.round_values

    def spy(self: randoms.VerifierRandom, round: int, i: int, purpose: int) -> float:
        drawn.append((round, i, purpose))
        return real(self, round, i, purpose)

    def spy_round(self: randoms.VerifierRandom, round: int, count: int) -> tuple[tuple[float, ...], ...]:
        drawn.extend((round, i, purpose) for purpose in (0, 1) for i in range(1, count + 1))
        return real_round(self, round, count)

    # Both ways to draw: one value, or a round's values at once (which may draw them one by one).
    monkeypatch.setattr(randoms.VerifierRandom, "uniform", spy)
    monkeypatch.setattr(randoms.VerifierRandom, "round_values", spy_round)
    for seed in (None, 5):
        drawn.clear()
        session = open_session(contract(rule=2, sampling=Sampling(seed=seed)))
        work = session.receive_proposal(proposal(session, (1, 2)), client=DRAFTER, now=0)
        assert isinstance(work, ScoreNeeded) and work.needs_q and work.uniforms is None and drawn == []
        with pytest.raises(BadProposal):
            session.provide_q([0.5, 0.0])
        with pytest.raises(QUnavailable):
            session.receive_proposal(proposal(session, (1, 2)), client=DRAFTER, now=0)
            session.provide_q()
        assert drawn == []
        session.receive_proposal(proposal(session, (1, 2)), client=DRAFTER, now=0)
        session.provide_q([0.5, 0.5])
        assert set(drawn) == {(1, i, purpose) for i in (1, 2, 3) for purpose in (0, 1)}


def test_q_unavailable_commits_nothing() -> None:
    """§6.3: if the rows cannot be obtained, the round is rejected with sdcp-q-unavailable and
    nothing is committed."""
    session = open_session(contract(rule=2))
    session.receive_proposal(proposal(session, (1,)), client=DRAFTER, now=0)
    with pytest.raises(QUnavailable) as info:
        session.provide_q()
    assert info.value.status == 409 and info.value.suffix == "sdcp-q-unavailable"
    assert session.committed == 0 and session.round == 0 and session.output(0).tokens == ()


def test_emitted_tokens_truncated_after_first_stop_token_and_at_max_new() -> None:
    """§6.3: the verifier truncates the emitted tokens after the first stop token and at max_new."""
    session = open_session(contract(stop=(2, 3)))
    assert run_round(session, (5, 3, 2), 3, 6).verdict.emitted == (5, 3)
    session = open_session(contract(stop=(), max_new=2))
    assert run_round(session, (5, 3, 2), 3, 6).verdict.emitted == (5, 3)


def test_verdict_and_output_only_after_the_commit_record_is_appended() -> None:
    """§6.3: the commit record (epoch, round, emitted, n, d[n]) is appended first; only after the
    append succeeds is the verdict sent and the output made available."""
    session = open_session()
    session.receive_proposal(proposal(session, (4, 5)), client=DRAFTER, now=0)
    append = session.complete_scoring(1, 7)
    r = append.record
    assert (r.epoch, r.round, r.emitted, r.committed) == (1, 1, (4, 7), 2)
    assert session.output(0).tokens == () and session.verdict_for(1) is None
    done = session.append_done(ok=True)
    assert isinstance(done, RoundDone) and done.verdict.digest == r.digest
    assert session.output(0).tokens == (4, 7)


def test_fenced_append_discards_round_releases_nothing_and_stops_serving() -> None:
    """§6.3: if the append fails because the log has been fenced, the verifier MUST discard the
    round, release no output, and stop serving the session."""
    session = open_session()
    run_round(session, (4,), 1, 5)
    p = proposal(session, (6,))
    session.receive_proposal(p, client=DRAFTER, now=0)
    session.complete_scoring(1, 7)
    assert session.append_done(ok=False, fenced=True) == Discarded(2, closed=True)
    assert session.state is State.FENCED and session.committed == 2 and session.verdict_for(2) is None
    with pytest.raises(StaleEpoch):
        session.output(0)
    with pytest.raises(StaleEpoch):
        session.receive_proposal(p, client=DRAFTER, now=0)


def test_commit_and_verdict_atomic_with_respect_to_concurrent_proposals() -> None:
    """§6.3: the commit and the recording of the verdict MUST be atomic with respect to
    concurrent proposals for the session."""
    session = open_session()
    p = proposal(session, (4, 5))
    session.receive_proposal(p, client=DRAFTER, now=0)
    session.complete_scoring(2, 6)
    # While the record is being appended: the same request waits, any other one is refused,
    # and none of them sees a half-done commit.
    assert session.receive_proposal(p, client=DRAFTER, now=0) == Pending(1)
    for other in (replace(p, tokens=(4, 6)), replace(p, round=2, base=3)):
        with pytest.raises(StaleBase) as info:
            session.receive_proposal(other, client=DRAFTER, now=0)
        assert info.value.extra["session_state"]["committed"] == 0
    done = session.append_done(ok=True)
    assert session.receive_proposal(p, client=DRAFTER, now=0) == done.verdict
    assert (session.round, session.committed) == (1, 3)


def test_drafter_discards_draft_state_beyond_accepted_positions() -> None:
    """§6.3: after the verdict the drafter MUST discard its draft state beyond the accepted
    positions: its next proposal builds on the verdict's prefix, not on its own."""
    verifier = open_session()
    drafter = DrafterSession(assignment(verifier))
    prop = drafter.propose([4, 5, 6], STATUS)
    verifier.receive_proposal(prop, client=DRAFTER, now=0)
    verifier.complete_scoring(1, 9)
    verdict = verifier.append_done(ok=True).verdict
    drafter.on_verdict(verdict)
    nxt = drafter.propose([1], STATUS)
    assert (nxt.base, nxt.base_digest) == (2, verifier.digest)
    assert verdict.action is Action.CONTINUE


def test_authorization_is_the_authenticated_identity_and_comes_before_fencing() -> None:
    """§6.3 Authorization, then Fencing: the authenticated client (the peer's certificate base
    URI) MUST be the drafter of the latest assignment, whatever the proposal's own ``drafter``
    member says; a proposal of another epoch from anyone else is not-assigned, not stale-epoch."""
    from sdcp_fast.protocol.peer import Peer, PeerRole

    session = open_session()
    mallory = Peer(uri="https://mallory/", role=PeerRole.DRAFTER)
    for p in (proposal(session, (4,)), proposal(session, (4,), epoch=7)):
        with pytest.raises(NotAssigned):
            session.receive_proposal(p, client=mallory, now=0)
    assigned = Peer(uri=DRAFTER, role=PeerRole.DRAFTER)
    with pytest.raises(StaleEpoch):
        session.receive_proposal(proposal(session, (4,), epoch=7), client=assigned, now=0)
    assert isinstance(session.receive_proposal(proposal(session, (4,)), client=assigned, now=0), ScoreNeeded)


def test_roles_act_only_as_the_role_their_certificate_names() -> None:
    """§6.3 / §5.1 mutual authentication: a drafter certificate can act only as a drafter (POST
    proposals), a router's only as a router (POST sessions, PUT drafter, policy): sdcp-forbidden."""
    from sdcp_fast.protocol.peer import Peer, PeerRole, require_role
    from sdcp_fast.protocol.problems import Forbidden

    drafter = Peer(uri=DRAFTER, role=PeerRole.DRAFTER)
    router = Peer(uri="https://router/", role=PeerRole.ROUTER)
    assert require_role(drafter, PeerRole.DRAFTER) is drafter
    for peer, role in ((drafter, PeerRole.ROUTER), (router, PeerRole.DRAFTER)):
        with pytest.raises(Forbidden) as info:
            require_role(peer, role)
        assert info.value.status == 403


@pytest.mark.parametrize("rule", [1, 2])
def test_token_outside_the_vocabulary_is_bad_proposal_before_scoring(rule: int) -> None:
    """§6.3 Scoring needs p over the target's vocabulary: a proposed token outside it cannot be
    verified under either rule and is sdcp-bad-proposal (422) before any work (defect (a))."""
    from sdcp_fast.protocol.messages import SessionOpen
    from sdcp_fast.protocol.session import VerifierSession

    so = SessionOpen(session=SID, epoch=1, contract=contract(rule=rule), prompt=PROMPT, commit_log="l")
    session, _ = VerifierSession.open(so, target_digest=TARGET, vocab=16)
    session.assign(assignment(session))
    with pytest.raises(BadProposal) as info:
        session.receive_proposal(proposal(session, (3, 16)), client=DRAFTER, now=0)
    assert info.value.status == 422 and session.state is State.READY


def test_a_refused_round_never_leaves_the_session_waiting() -> None:
    """§6.3 with §6.4: a round whose random values cannot be derived (round past uint32) is
    refused before the session changes state, and a resume that would lead there is refused at
    open, so no retry is answered "in progress" forever (defect (b))."""
    from sdcp_fast.protocol.problems import BadRequest

    session = open_session(contract(rule=2, sampling=Sampling(seed=1)))
    session.round = 2**32 - 1
    with pytest.raises(BadRequest):
        session.receive_proposal(proposal(session, (4,)), client=DRAFTER, now=0)
    assert session.state is State.READY
    with pytest.raises(BadRequest):  # the same again: refused again, not Pending
        session.receive_proposal(proposal(session, (4,)), client=DRAFTER, now=0)
