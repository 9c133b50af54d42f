"""Conformance: §4.2 Committed-Prefix Digest Chain."""

from __future__ import annotations

import hashlib

import pytest

from sdcp_fast.protocol.contract import contract_digest
from sdcp_fast.protocol.digests import extend_digest, prefix_digest
from sdcp_fast.protocol.problems import BadRequest

CD = contract_digest({
    "target": b"\x10" * 32, "tokenizer": b"\x20" * 32, "rule": 1, "m_max": 4, "max_new": 8, "stop": [],
    "low_rounds": 1, "fallback": [5],
})


def test_d0_binds_domain_contract_digest_prompt_length_and_prompt_tokens() -> None:
    """§4.2: d[0] = SHA-256("SDCP-PREFIX-1" || 0x00 || contract_digest || uint32(P) || uint32(t[0]) ||
    ... || uint32(t[P-1]))."""
    prompt = [5, 70000, 0xFFFFFFFF]
    by_hand = hashlib.sha256(
        b"SDCP-PREFIX-1\x00" + CD + (3).to_bytes(4, "big") + b"".join(t.to_bytes(4, "big") for t in prompt)
    ).digest()
    assert prefix_digest(CD, prompt) == by_hand


def test_dk_extends_the_previous_digest_by_one_token() -> None:
    """§4.2: d[k] = SHA-256(d[k-1] || uint32(o[k])) for k = 1..n."""
    d0 = prefix_digest(CD, [1])
    d1 = hashlib.sha256(d0 + (9).to_bytes(4, "big")).digest()
    assert extend_digest(d0, [9]) == d1
    assert extend_digest(d0, [9, 10]) == hashlib.sha256(d1 + (10).to_bytes(4, "big")).digest()


def test_uint32_is_four_octets_in_network_byte_order() -> None:
    """§4.2: uint32() is four octets in network byte order."""
    d0 = prefix_digest(CD, [])
    assert extend_digest(d0, [0x01020304]) == hashlib.sha256(d0 + b"\x01\x02\x03\x04").digest()


def test_prefix_that_uint32_cannot_hold_is_refused() -> None:
    """§4.2: a token id at or above 2^32 has no uint32() form, so no digest; it is refused, not truncated."""
    with pytest.raises(BadRequest):
        prefix_digest(CD, [1 << 32])
    with pytest.raises(BadRequest):
        extend_digest(prefix_digest(CD, []), [1 << 32])


def test_different_or_outdated_prefix_gives_a_different_digest() -> None:
    """§4.2: because d[n] depends on every committed token, a proposal built on a different or
    outdated prefix is detected without comparing token lists."""
    d0 = prefix_digest(CD, [1, 2])
    current = extend_digest(d0, [3, 4])
    assert extend_digest(d0, [3]) != current  # outdated
    assert extend_digest(d0, [3, 5]) != current  # forked
    assert extend_digest(prefix_digest(CD, [1, 3]), [3, 4]) != current  # different prompt
    other_contract = bytes(32)
    assert extend_digest(prefix_digest(other_contract, [1, 2]), [3, 4]) != current  # different contract
