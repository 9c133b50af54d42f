"""Conformance: §6.2 Drafting and Proposal."""

from __future__ import annotations

import pytest

from sdcp_fast.protocol.drafting import DrafterError, DrafterSession, choose_m, expected_tokens
from sdcp_fast.protocol.problems import Limit
from sdcp_fast.protocol.session import ScoreNeeded
from tests.spec.s6kit import DRAFTER, STATUS, assignment, open_session, proposal


def _verify(verifier, prop, accepted, token):
    assert isinstance(verifier.receive_proposal(prop, client=DRAFTER, now=0), ScoreNeeded)
    verifier.complete_scoring(accepted, token)
    return verifier.append_done(ok=True).verdict


def test_m_is_between_one_and_min_of_m_max_and_m_cap() -> None:
    """§6.2: 1 <= M <= min(m_max, m_cap), m_init before the first verdict; the verifier
    refuses anything else with sdcp-limit (Table 2)."""
    verifier = open_session(m_init=2)
    for tokens in ((), (1, 1, 1)):
        with pytest.raises(Limit) as info:
            verifier.receive_proposal(proposal(verifier, tokens), client=DRAFTER, now=0)
        assert info.value.status == 422 and info.value.suffix == "sdcp-limit"
    drafter = DrafterSession(assignment(verifier, m_init=2))
    with pytest.raises(DrafterError):
        drafter.propose([1, 1, 1], STATUS)
    verdict = _verify(verifier, drafter.propose([1, 1], STATUS), 2, 3)
    drafter.on_verdict(verdict)
    assert drafter.limit == verdict.m_cap == 3  # restored by one after a good round


def test_proposal_carries_base_and_round_from_the_last_verdict() -> None:
    """§6.2: base and base_digest are the committed length and digest last learned; round is
    the last verdict's round plus one."""
    verifier = open_session()
    drafter = DrafterSession(assignment(verifier))
    verdict = _verify(verifier, drafter.propose([4, 5], STATUS), 1, 9)
    drafter.on_verdict(verdict)
    nxt = drafter.propose([6], STATUS)
    assert (nxt.round, nxt.base, nxt.base_digest) == (verdict.round + 1, verdict.committed, verdict.digest)


def test_drafter_never_has_two_outstanding_proposals() -> None:
    """§6.2: a drafter MUST NOT have more than one outstanding proposal per session."""
    drafter = DrafterSession(assignment(open_session()))
    drafter.propose([4], STATUS)
    with pytest.raises(DrafterError):
        drafter.propose([5], STATUS)


def test_speculative_next_proposal_only_after_confirmation() -> None:
    """§6.2: a drafter MAY prepare the next proposal assuming full acceptance, but sends it only
    after the verdict confirms that assumption."""
    verifier = open_session()
    drafter = DrafterSession(assignment(verifier))
    verdict = _verify(verifier, drafter.propose([4, 5], STATUS), 2, 6)
    assert drafter.on_verdict(verdict, assumed=(4, 5, 6)).speculation_ok
    verdict = _verify(verifier, drafter.propose([7, 8], STATUS), 1, 6)
    assert not drafter.on_verdict(verdict, assumed=(7, 8, 6)).speculation_ok


def test_recommended_choice_of_m_maximizes_expected_tokens_per_time() -> None:
    """§6.2 (RECOMMENDED): choose the M within limits maximizing (1 - alpha^(M+1)) / (1 - alpha)
    divided by (M * t_d + t_v); M + 1 tokens at alpha = 1."""
    alpha, t_d, t_v = 0.8, 1.0, 6.0
    rates = {m: expected_tokens(alpha, m) / (m * t_d + t_v) for m in range(1, 9)}
    assert choose_m(alpha, t_d, t_v, 8) == max(rates, key=lambda m: rates[m])
    assert expected_tokens(1.0, 5) == 6
    # A loaded drafter (larger t_d) proposes fewer tokens.
    assert choose_m(alpha, 3.0, t_v, 8) < choose_m(alpha, t_d, t_v, 8)


def test_drafter_takes_base_and_m_cap_only_from_a_verdict_that_answers_its_proposal() -> None:
    """§6.2: base, round and m_cap come from the last verdict, so a verdict that cannot answer
    the outstanding proposal (a > M, emitted tokens not the accepted ones, committed or digest
    not the chain's) is refused with sdcp-bad-request and the drafter keeps what it had
    (defect (c)); the proposal stays outstanding for a retry."""
    from dataclasses import replace

    from sdcp_fast.protocol.problems import BadRequest

    verifier = open_session()
    drafter = DrafterSession(assignment(verifier))
    prop = drafter.propose([4, 5], STATUS)
    verdict = _verify(verifier, prop, 1, 9)
    kept = (drafter.round, drafter.committed, drafter.digest, drafter.m_cap)
    for bad in (replace(verdict, accepted=3), replace(verdict, emitted=(5, 9)),
                replace(verdict, committed=7), replace(verdict, digest=bytes(32))):
        with pytest.raises(BadRequest) as info:
            drafter.on_verdict(bad)
        assert info.value.status == 400
        assert (drafter.round, drafter.committed, drafter.digest, drafter.m_cap) == kept
        assert drafter.retry() is prop
    drafter.on_verdict(verdict)
    assert (drafter.round, drafter.committed, drafter.digest) == (1, 2, verifier.digest)
