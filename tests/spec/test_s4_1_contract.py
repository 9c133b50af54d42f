"""Conformance: §4.1 Session Contract."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

from sdcp_fast.protocol import cbor
from sdcp_fast.protocol.contract import contract_digest, permits_drafter
from sdcp_fast.protocol.messages import Assignment, Contract, SessionOpen
from sdcp_fast.protocol.problems import BadContract

CONTRACT: dict[str, Any] = {
    "target": b"\x10" * 32, "tokenizer": b"\x20" * 32, "rule": 2, "m_max": 8, "max_new": 64, "stop": [2],
    "low_rounds": 2, "fallback": [1, 2, 5], "sampling": {"temperature_milli": 800, "seed": 9},
}
SESSION_OPEN: dict[str, Any] = {
    "session": bytes(16), "epoch": 1, "contract": CONTRACT, "prompt": [1, 2], "commit_log": "mlc://log",
}


def refused(change: dict[str, Any]) -> None:
    raw = {**CONTRACT, **change}
    with pytest.raises(BadContract) as info:
        Contract.from_map(raw)
    assert info.value.suffix == "sdcp-bad-contract" and info.value.status == 422
    if all(not isinstance(v, int) or -(1 << 64) <= v < (1 << 64) for v in raw.values()):
        with pytest.raises(BadContract):
            Contract.decode(cbor.deterministic_cbor(raw))


def test_contract_with_unknown_key_is_rejected_with_bad_contract() -> None:
    """§4.1: a contract that contains a key not defined by this document MUST be rejected with
    problem type "sdcp-bad-contract"."""
    refused({"priority": 3})


def test_contract_with_unknown_key_inside_sampling_is_rejected_with_bad_contract() -> None:
    """§4.1: a key not defined by the draft MUST be rejected anywhere in the contract, the sampling
    profile included."""
    refused({"sampling": {"seed": 9, "min_p_milli": 10}})


def test_session_open_carrying_a_contract_with_unknown_key_is_bad_contract() -> None:
    """§4.1, §5.2: the contract rule holds inside session-open, whose own unknown keys are ignored."""
    with pytest.raises(BadContract):
        SessionOpen.decode(cbor.deterministic_cbor({**SESSION_OPEN, "contract": {**CONTRACT, "x": 0}}))
    assert SessionOpen.decode(cbor.deterministic_cbor({**SESSION_OPEN, "x": 0})).contract == Contract.from_map(CONTRACT)


def test_assignment_carrying_a_contract_with_unknown_key_is_bad_contract() -> None:
    """§4.1, §5.2: the contract in an assignment is refused like the one in session-open."""
    assignment = {k: v for k, v in SESSION_OPEN.items() if k != "commit_log"} | {
        "verifier": "https://v", "drafter": "https://d", "round": 0, "committed": 0, "digest": bytes(32), "m_init": 1,
        "contract": {**CONTRACT, "x": 0},
    }
    with pytest.raises(BadContract):
        Assignment.decode(cbor.deterministic_cbor(assignment))


def test_contract_digest_is_sha256_of_domain_separator_and_deterministic_cbor() -> None:
    """§4.1: contract_digest = SHA-256("SDCP-CONTRACT-1" || 0x00 || deterministic_cbor(contract)),
    with the core deterministic encoding of RFC 8949 §4.2.1."""
    expected = hashlib.sha256(b"SDCP-CONTRACT-1\x00" + cbor.deterministic_cbor(CONTRACT)).digest()
    assert contract_digest(CONTRACT) == expected
    assert contract_digest(Contract.from_map(CONTRACT)) == expected


def test_contract_digest_does_not_depend_on_the_received_encoding() -> None:
    """§4.1: all parties compute the contract digest over the same content, whatever encoding
    (key order, indefinite lengths, long heads) carried it."""
    loose = bytes.fromhex("bf") + b"".join(
        cbor.deterministic_cbor(k) + cbor.deterministic_cbor(v) for k, v in reversed(CONTRACT.items())
    ) + b"\xff"
    assert contract_digest(Contract.decode(loose)) == contract_digest(CONTRACT)


def test_contract_digest_is_over_the_contract_as_created_absent_members_stay_absent() -> None:
    """§4.1: the contract digest is computed once, over the contract as created; an optional
    member that was absent is not filled in with its default."""
    with_default = {**CONTRACT, "low_ratio": 0}
    assert Contract.from_map(CONTRACT).to_map() == CONTRACT
    assert contract_digest(with_default) != contract_digest(CONTRACT)


@pytest.mark.parametrize("m_max", [65, 1000])
def test_contract_m_max_above_64_is_bad_contract(m_max: int) -> None:
    """§4.1: m_max is uint .le 64."""
    refused({"m_max": m_max})


def test_contract_low_rounds_zero_is_bad_contract() -> None:
    """§4.1: low_rounds is uint .ge 1."""
    refused({"low_rounds": 0})


@pytest.mark.parametrize("key", ["low_ratio", "self_load"])
def test_contract_percentages_above_100_are_bad_contract(key: str) -> None:
    """§4.1: low_ratio and self_load are uint .le 100."""
    refused({key: 101})


def test_contract_top_p_milli_above_1000_is_bad_contract() -> None:
    """§4.1: sampling.top_p_milli is uint .le 1000."""
    refused({"sampling": {"top_p_milli": 1001}})


@pytest.mark.parametrize(("key", "size"), [("target", 31), ("tokenizer", 33), ("scope", 15), ("scope", 17)])
def test_contract_byte_string_sizes_are_enforced(key: str, size: int) -> None:
    """§4.1: target and tokenizer are hash32 (bstr .size 32); scope is bstr .size 16."""
    refused({key: bytes(size)})


def test_contract_drafters_when_present_is_a_nonempty_list_of_hash32() -> None:
    """§4.1: ? drafters: [+ hash32]."""
    refused({"drafters": []})
    refused({"drafters": [bytes(31)]})


def test_contract_fallback_is_nonempty() -> None:
    """§4.1: fallback: [+ ladder]."""
    refused({"fallback": []})


@pytest.mark.parametrize("action", [0, 4])
def test_contract_fallback_holds_only_ladder_actions(action: int) -> None:
    """§4.1, §6.5.2: the fallback list MUST contain only the actions reduce, switch, self_decode,
    and fail; continue and finish are refused."""
    refused({"fallback": [1, action]})


def test_contract_with_unregistered_rule_is_bad_contract() -> None:
    """§4.1: rule is an acceptance rule of the registry; "sdcp-bad-contract" covers a contract
    that is not supported."""
    refused({"rule": 3})


@pytest.mark.parametrize("value", [-1, 1 << 64, "8", b"\x08", True, [8]])
def test_contract_uints_reject_other_types_and_ranges(value: Any) -> None:
    """§4.1: uint members hold unsigned integers below 2^64 and nothing else."""
    refused({"max_new": value})


def test_contract_missing_required_member_is_bad_contract() -> None:
    """§4.1: target, tokenizer, rule, m_max, max_new, stop, low_rounds and fallback are required."""
    for key in ("target", "tokenizer", "rule", "m_max", "max_new", "stop", "low_rounds", "fallback"):
        with pytest.raises(BadContract):
            Contract.from_map({k: v for k, v in CONTRACT.items() if k != key})


def test_absent_drafters_permits_any_draft_model() -> None:
    """§4.1: an absent "drafters" member permits any draft model."""
    open_contract = Contract.from_map(CONTRACT)
    closed = Contract.from_map({**CONTRACT, "drafters": [b"\x01" * 32]})
    assert permits_drafter(open_contract, b"\x02" * 32)
    assert permits_drafter(closed, b"\x01" * 32) and not permits_drafter(closed, b"\x02" * 32)
