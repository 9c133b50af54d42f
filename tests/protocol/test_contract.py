"""Session contract (§4.1): validation of every constraint and the contract digest."""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any

import cbor2
import pytest
from hypothesis import given

from sdcp_fast.protocol.contract import (
    CONTRACT_DOMAIN,
    contract_digest,
    fallback_actions,
    parse_contract,
    permits_drafter,
)
from sdcp_fast.protocol.messages import Action, Contract, Sampling
from sdcp_fast.protocol.problems import BadContract
from tests.protocol.message_strategies import CONTRACT, contracts

MINIMAL: dict[str, Any] = {
    "target": b"\x01" * 32, "tokenizer": b"\x02" * 32, "rule": 1, "m_max": 4, "max_new": 16, "stop": [],
    "low_rounds": 1, "fallback": [5],
}


def test_minimal_contract_parses_with_optionals_absent() -> None:
    contract = Contract.from_map(MINIMAL)
    assert contract.drafters is None and contract.sampling is None and contract.scope is None
    assert contract.to_map() == MINIMAL


def test_digest_is_sha256_of_domain_and_deterministic_cbor() -> None:
    expected = hashlib.sha256(b"SDCP-CONTRACT-1\x00" + cbor2.dumps(MINIMAL, canonical=True)).digest()
    assert contract_digest(MINIMAL) == expected
    assert contract_digest(Contract.from_map(MINIMAL)) == expected
    assert CONTRACT_DOMAIN == b"SDCP-CONTRACT-1\x00"


@given(contracts)
def test_digest_of_typed_and_decoded_map_agree(contract: Contract) -> None:
    assert contract_digest(contract) == contract_digest(contract.to_map())
    assert contract_digest(Contract.decode(contract.encode())) == contract_digest(contract)


def test_digest_ignores_map_insertion_order() -> None:
    assert contract_digest(dict(reversed(list(MINIMAL.items())))) == contract_digest(MINIMAL)


@pytest.mark.parametrize(("key", "value"), [("low_ratio", 0), ("sampling", {}), ("self_max", 0)])
def test_absent_optional_member_and_its_default_give_different_digests(key: str, value: Any) -> None:
    # Absent stays absent: re-encoding reproduces what was received, so the digest differs.
    with_member = {**MINIMAL, key: value}
    assert Contract.from_map(with_member).to_map() == with_member
    assert contract_digest(with_member) != contract_digest(MINIMAL)


INVALID: list[tuple[str, Any]] = [
    ("target", b"\x01" * 31), ("target", b"\x01" * 33), ("tokenizer", "ab" * 32),
    ("drafters", []), ("drafters", [b"\x00" * 31]), ("drafters", b"\x00" * 32),
    ("rule", 0), ("rule", 3), ("rule", -1),
    ("m_max", 0), ("m_max", 65), ("max_new", -1), ("max_new", 1 << 64),
    ("stop", [1, "2"]), ("stop", [-1]), ("stop", 2),
    ("low_rounds", 0), ("low_ratio", 101), ("self_load", 101), ("self_max", -5),
    ("fallback", []), ("fallback", [0]), ("fallback", [4]), ("fallback", [1, 4, 5]), ("fallback", [-1]),
    ("scope", b"\x00" * 15), ("scope", b"\x00" * 17),
    ("sampling", {"top_p_milli": 1001}), ("sampling", {"top_k": -1}), ("sampling", {"temperature": 1}),
    ("sampling", []), ("unknown", 1), ("rules", 1),
]


@pytest.mark.parametrize(("key", "value"), INVALID, ids=[f"{k}={v!r:.16}" for k, v in INVALID])
def test_invalid_contract_is_bad_contract(key: str, value: Any) -> None:
    with pytest.raises(BadContract):
        Contract.from_map({**MINIMAL, key: value})
    with pytest.raises(BadContract):
        contract_digest({**MINIMAL, key: value})


def test_non_text_unknown_key_is_bad_contract() -> None:
    with pytest.raises(BadContract):
        Contract.from_map({**MINIMAL, 1: 1})


@pytest.mark.parametrize(("key", "value"), [
    ("m_max", 1), ("m_max", 64), ("low_ratio", 100), ("self_load", 100), ("low_rounds", (1 << 64) - 1),
    ("sampling", {"top_p_milli": 1000, "seed": (1 << 64) - 1}), ("stop", [0, (1 << 64) - 1]), ("rule", 2),
])
def test_boundary_values_are_accepted(key: str, value: Any) -> None:
    assert Contract.from_map({**MINIMAL, key: value}).to_map()[key] == value


def test_unknown_fallback_value_is_kept_for_the_digest_and_reads_as_fail() -> None:
    raw = {**MINIMAL, "fallback": [1, 9, 2]}
    contract = Contract.from_map(raw)
    assert contract.fallback == (1, 9, 2)
    assert contract.to_map() == raw
    assert fallback_actions(contract) == (Action.REDUCE, Action.FAIL, Action.SWITCH)
    assert contract_digest(raw) != contract_digest({**MINIMAL, "fallback": [1, 5, 2]})


def test_typed_contract_is_validated_before_digesting() -> None:
    with pytest.raises(BadContract):
        contract_digest(dataclasses.replace(CONTRACT, m_max=100))
    with pytest.raises(BadContract):
        parse_contract(dataclasses.replace(CONTRACT, sampling=Sampling(seed=-1)))
    assert parse_contract(CONTRACT) is CONTRACT


def test_non_map_contract_is_bad_contract() -> None:
    with pytest.raises(BadContract):
        contract_digest([1, 2])  # type: ignore[arg-type]


def test_permits_drafter() -> None:
    assert permits_drafter(CONTRACT, b"\x33" * 32)
    assert not permits_drafter(CONTRACT, b"\x34" * 32)
    assert permits_drafter(dataclasses.replace(CONTRACT, drafters=None), b"\x34" * 32)
