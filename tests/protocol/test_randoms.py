"""Verifier random values (§6.4)."""

from __future__ import annotations

import hashlib
import hmac
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sdcp_fast.protocol.problems import BadRequest
from sdcp_fast.protocol.randoms import (
    PURPOSE_ACCEPT,
    PURPOSE_DRAW,
    VerifierRandom,
    secure_uniform,
    verifier_uniform,
)

SESSION = bytes(range(16))


def by_hand(seed: int, session: bytes, round_: int, i: int, purpose: int) -> float:
    msg = b"SDCP-VERIFY-1\x00" + session + struct.pack(">I", round_) + struct.pack(">I", i) + bytes([purpose])
    mac = hmac.new(struct.pack(">Q", seed), msg, hashlib.sha256).digest()
    return (int.from_bytes(mac, "big") >> (256 - 53)) / 2**53


@given(st.integers(0, (1 << 64) - 1), st.binary(min_size=16, max_size=16), st.integers(0, 0xFFFFFFFF),
       st.integers(0, 0xFFFFFFFF), st.sampled_from([PURPOSE_ACCEPT, PURPOSE_DRAW]))
def test_matches_the_hmac_derivation(seed: int, session: bytes, round_: int, i: int, purpose: int) -> None:
    r = verifier_uniform(seed, session, round_, i, purpose)
    assert r == by_hand(seed, session, round_, i, purpose)
    assert 0.0 <= r < 1.0
    assert VerifierRandom(seed, session).uniform(round_, i, purpose) == r


def test_purposes_positions_rounds_and_seeds_give_independent_values() -> None:
    values = {
        verifier_uniform(seed, SESSION, round_, i, purpose)
        for seed in (0, 1) for round_ in (1, 2) for i in (1, 2, 3) for purpose in (0, 1)
    }
    assert len(values) == 2 * 2 * 3 * 2


def test_keyed_once_then_copied_gives_the_same_values_in_any_order() -> None:
    source = VerifierRandom(7, SESSION)
    forward = [source.uniform(1, i, 0) for i in range(1, 6)]
    backward = [source.uniform(1, i, 0) for i in reversed(range(1, 6))]
    assert forward == backward[::-1]
    assert source.seeded


def test_without_seed_values_come_from_the_csprng() -> None:
    source = VerifierRandom(None, SESSION)
    assert not source.seeded
    values = [source.uniform(1, 1, 0) for _ in range(64)]
    assert all(0.0 <= v < 1.0 for v in values)
    assert len(set(values)) > 60  # 53 random bits each: a repeat is all but impossible
    assert 0.0 <= secure_uniform() < 1.0


@pytest.mark.parametrize(("round_", "i", "purpose"), [(-1, 1, 0), (1 << 32, 1, 0), (1, 1 << 32, 0), (1, 1, 256)])
def test_arguments_outside_their_widths_are_bad_request(round_: int, i: int, purpose: int) -> None:
    with pytest.raises(BadRequest):
        verifier_uniform(1, SESSION, round_, i, purpose)
    with pytest.raises(BadRequest):
        VerifierRandom(None, SESSION).uniform(round_, i, purpose)


@pytest.mark.parametrize("seed", [-1, 1 << 64, True, 1.0])
def test_seed_must_be_uint64(seed: object) -> None:
    with pytest.raises(BadRequest):
        VerifierRandom(seed, SESSION)  # type: ignore[arg-type]


@pytest.mark.parametrize("session", [bytes(15), bytes(17), "s" * 16])
def test_session_must_be_16_bytes(session: object) -> None:
    with pytest.raises(BadRequest):
        VerifierRandom(1, session)  # type: ignore[arg-type]


def test_mean_is_near_one_half() -> None:
    values = [verifier_uniform(3, SESSION, 1, i, 0) for i in range(1, 20001)]
    assert abs(sum(values) / len(values) - 0.5) < 0.01  # 7 sigma for 20,000 uniforms


def test_without_seed_many_values_come_from_one_system_call(monkeypatch: pytest.MonkeyPatch) -> None:
    import os
    import random

    calls: list[int] = []
    real = os.urandom

    def counted(n: int) -> bytes:
        calls.append(n)
        return real(n)

    monkeypatch.setattr(os, "urandom", counted)
    monkeypatch.setattr(random, "_urandom", counted)  # what secrets' SystemRandom reads
    source = VerifierRandom(None, b"s" * 16)
    values = [source.uniform(r, i, p) for r in range(1, 4) for i in range(1, 6) for p in (0, 1)]
    assert len(calls) == 1
    assert len(set(values)) == len(values) and all(0.0 <= v < 1.0 for v in values)
    more = [source.uniform(9, i, 0) for i in range(1, 200)]  # past the first draw: drawn again, never reused
    assert len(calls) > 1 and not set(more) & set(values) and len(set(more)) == len(more)


@pytest.mark.parametrize("count", [1, 5, 32, 33, 200])
def test_a_rounds_values_at_once_are_its_values_one_by_one(count: int) -> None:
    seeded = VerifierRandom(7, SESSION)
    accept, draw = seeded.round_values(11, count)
    assert accept == tuple(by_hand(7, SESSION, 11, i, PURPOSE_ACCEPT) for i in range(1, count + 1))
    assert draw == tuple(by_hand(7, SESSION, 11, i, PURPOSE_DRAW) for i in range(1, count + 1))
    # Unseeded: fresh CSPRNG values, none reused across calls, the pool drawn again when it runs out.
    source = VerifierRandom(None, SESSION)
    seen: list[float] = []
    for round_ in range(1, 40):
        accept, draw = source.round_values(round_, count)
        assert len(accept) == len(draw) == count
        seen += [*accept, *draw]
    assert all(0.0 <= v < 1.0 for v in seen)
    assert len(set(seen)) == len(seen)


@pytest.mark.parametrize("round_", [-1, 1 << 32])
def test_a_round_outside_uint32_is_bad_request_for_its_values_at_once(round_: int) -> None:
    for source in (VerifierRandom(None, SESSION), VerifierRandom(1, SESSION)):
        with pytest.raises(BadRequest):
            source.round_values(round_, 5)
