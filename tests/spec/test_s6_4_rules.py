"""Conformance: §6.4 Acceptance Rules."""

from __future__ import annotations

import hashlib
import hmac
import math
import random
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sdcp_fast.protocol.acceptance import argmax, greedy, profile_distribution, speculative
from sdcp_fast.protocol.messages import Sampling
from sdcp_fast.protocol.problems import BadProposal
from sdcp_fast.protocol.session import RoundDone, ScoreNeeded
from tests.spec.s6kit import DRAFTER, SID, contract, open_session, proposal

V = 6


def toy_logits(context: tuple[int, ...]) -> list[float]:
    """A deterministic stand-in for the target model: logits as a function of the context."""
    digest = hashlib.sha256(repr(context).encode()).digest()
    return [digest[k] / 16.0 for k in range(V)]


def greedy_decode(prompt: tuple[int, ...], n: int) -> list[int]:
    out: list[int] = []
    for _ in range(n):
        out.append(argmax(toy_logits(prompt + tuple(out))))
    return out


@settings(max_examples=30, deadline=None)
@given(st.lists(st.lists(st.integers(0, V - 1), min_size=1, max_size=4), min_size=1, max_size=8))
def test_rule1_output_is_greedy_decoding_whatever_the_drafter_proposes(drafts: list[list[int]]) -> None:
    """§6.4 Rule 1: x[i] is accepted iff it is argmax p[i] (ties to the smallest id), evaluation
    stops at the first miss, the extra token is argmax p[a+1]; the output is identical to greedy
    decoding of the target whatever the drafter proposes."""
    session = open_session(contract(stop=(), max_new=40, m_max=4, low_rounds=100))
    for draft in drafts:
        work = session.receive_proposal(proposal(session, draft), client=DRAFTER, now=0)
        assert isinstance(work, ScoreNeeded)
        rows = [toy_logits(work.context + tuple(draft[:i])) for i in range(len(draft) + 1)]
        result = greedy(rows, draft)
        session.complete_scoring(result.accepted, result.next_token)
        assert isinstance(session.append_done(ok=True), RoundDone)
    out = list(session.output(0).tokens)
    assert out == greedy_decode(session.prompt, len(out))


def test_rule1_ties_go_to_smallest_token_id() -> None:
    """§6.4 Rule 1: ties are broken in favor of the smallest token identifier."""
    assert greedy([[0.0, 2.0, 2.0], [5.0, 5.0, 1.0]], [1]).next_token == 0
    assert greedy([[0.0, 2.0, 2.0], [5.0, 5.0, 1.0]], [2]).accepted == 0


def test_rule2_output_has_the_target_distribution() -> None:
    """§6.4 Rule 2: accept iff r < min(1, p/q); at the first rejection draw from normalized
    max(0, p - q); after full acceptance from p[M+1]. With exact q the output follows p."""
    rng = random.Random(7)
    p1 = [0.05, 0.4, 0.3, 0.15, 0.1, 0.0]
    q1 = [0.3, 0.1, 0.1, 0.2, 0.2, 0.1]
    p2 = [1 / V] * V
    n = 12000
    counts = [0] * V
    for _ in range(n):
        x = rng.choices(range(V), weights=q1)[0]
        result = speculative([p1, p2], [q1], [x], lambda i, k: rng.random())
        counts[x if result.accepted else result.next_token] += 1
    chi2 = sum((c - pk * n) ** 2 / (pk * n) for c, pk in zip(counts, p1, strict=True) if pk > 0)
    df = sum(1 for pk in p1 if pk > 0) - 1
    assert counts[5] == 0 and chi2 < df + 10 * math.sqrt(2 * df)


def test_rule2_proposal_must_carry_q_rows() -> None:
    """§6.4 Rule 2: the proposal MUST carry q_rows."""
    session = open_session(contract(rule=2))
    with pytest.raises(BadProposal):
        session.receive_proposal(replace(proposal(session, (1,)), q_rows=None), client=DRAFTER, now=0)


def test_rule2_zero_q_is_bad_proposal_before_any_draw() -> None:
    """§6.4 Rule 2: a proposal for which q[i](x[i]) is zero is rejected, before any random draw,
    with sdcp-bad-proposal."""
    def no_draw(i: int, purpose: int) -> float:
        raise AssertionError("drew a random value")

    with pytest.raises(BadProposal) as info:
        speculative([[0.5, 0.5], [0.5, 0.5], [1.0, 0.0]], [[0.5, 0.5], [1.0, 0.0]], [0, 1], no_draw)
    assert info.value.status == 422 and info.value.suffix == "sdcp-bad-proposal"


def _by_hand(seed: int, session: bytes, round: int, i: int, purpose: int) -> float:
    msg = b"SDCP-VERIFY-1\x00" + session + round.to_bytes(4, "big") + i.to_bytes(4, "big") + bytes([purpose])
    mac = hmac.new(seed.to_bytes(8, "big"), msg, hashlib.sha256).digest()
    return (int.from_bytes(mac, "big") >> (256 - 53)) / 2**53


def test_seeded_verifier_values_are_the_hmac_derivation() -> None:
    """§6.4: with a seed, each value is HMAC-SHA-256 keyed with the seed (8 octets, network order)
    over "SDCP-VERIFY-1" || 0x00 || session || uint32(round) || uint32(i) || uint8(purpose), the
    first 53 bits divided by 2^53: independent of the drafter's own sampling."""
    session = open_session(contract(rule=2, sampling=Sampling(seed=123456789)))
    session.receive_proposal(proposal(session, (1, 2)), client=DRAFTER, now=0)
    u = session.provide_q([0.5, 0.5])
    assert [u(i, k) for i in (1, 2, 3) for k in (0, 1)] == [
        _by_hand(123456789, SID, 1, i, k) for i in (1, 2, 3) for k in (0, 1)]


def test_without_seed_values_come_from_a_csprng() -> None:
    """§6.4: without a seed, the verifier uses a cryptographically secure random number generator."""
    values = set()
    for _ in range(2):
        session = open_session(contract(rule=2))
        session.receive_proposal(proposal(session, (1,)), client=DRAFTER, now=0)
        u = session.provide_q([0.5])
        values.update(u.accept + u.draw)
    assert len(values) == 8 and all(0.0 <= r < 1.0 for r in values)


def test_target_distribution_is_the_sampling_profile() -> None:
    """§4.1 via §6.4: p[i] is the target distribution after temperature, top-k, top-p, in order."""
    logits = [math.log(x) for x in (0.1, 0.2, 0.3, 0.4)]
    assert profile_distribution(logits, Sampling(top_k=3, top_p_milli=500)) == pytest.approx([0, 0, 3 / 7, 4 / 7])
    assert profile_distribution(logits, Sampling(temperature_milli=0)) == [0, 0, 0, 1]


def test_drafter_side_does_not_use_the_verifier_derivation(monkeypatch: pytest.MonkeyPatch) -> None:
    """§6.4: drafters MUST NOT use the verifier's derivation for their own sampling. With every
    way to the verifier's values (the HMAC derivation, its session object, the CSPRNG) made to
    fail, the core's drafter side still runs a whole exchange: choosing M, proposing, following
    verdicts, retrying, resynchronizing and estimating acceptance draw on none of them."""
    from sdcp_fast.protocol import randoms
    from sdcp_fast.protocol.drafting import DrafterSession
    from sdcp_fast.protocol.problems import StaleBase
    from tests.spec.s6kit import STATUS, assignment, run_round

    verifier = open_session(contract(rule=2, sampling=Sampling(seed=9)))
    drafter = DrafterSession(assignment(verifier))
    drafted = [drafter.propose([1, 2][: drafter.choose_m(0.01, 0.05)], STATUS, q_rows="mlc://q")]
    verdicts = [run_round(verifier, drafted[0].tokens, 1, 3).verdict]

    def forbidden(*args: object, **kwargs: object) -> float:
        raise AssertionError("the drafter side reached the verifier's random values")

    for name in ("verifier_uniform", "secure_uniform"):
        monkeypatch.setattr(randoms, name, forbidden)
    monkeypatch.setattr(randoms.VerifierRandom, "uniform", forbidden)
    monkeypatch.setattr(randoms.VerifierRandom, "round_values", forbidden)
    monkeypatch.setattr(randoms.secrets, "randbits", forbidden)
    monkeypatch.setattr(randoms.hmac, "new", forbidden)
    drafter.retry()
    outcome = drafter.on_verdict(verdicts[0], assumed=(1, 3))
    assert outcome.proceed and drafter.committed == verifier.committed
    assert 0.0 <= drafter.estimator.alpha <= 1.0 and 0 <= drafter.estimator.accept_milli <= 1000
    drafter.propose([4], STATUS, q_rows="mlc://q2")
    drafter.on_problem(StaleBase("behind", extra={"session_state": verifier.session_state().to_map()}))
    assert drafter.round == verifier.round and drafter.choose_m(0.01, 0.05) >= 1
