"""The committed vectors (tests/vectors/*.json) against the code, recomputed independently where possible."""

from __future__ import annotations

import hashlib
import hmac
import importlib.util
import json
import struct
from pathlib import Path
from types import ModuleType
from typing import Any

import cbor2
import pycddl
import pytest

from sdcp_fast.protocol import cbor
from sdcp_fast.protocol.commitlog import decode_log, decode_record, encode_record
from sdcp_fast.protocol.contract import contract_digest
from sdcp_fast.protocol.digests import extend_digest, prefix_digest
from sdcp_fast.protocol.messages import (
    Assignment,
    Contract,
    Event,
    Output,
    Policy,
    Proposal,
    SessionOpen,
    SessionState,
    Status,
    Verdict,
)
from sdcp_fast.protocol.problems import SdcpProblem
from sdcp_fast.protocol.randoms import verifier_uniform

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
MESSAGE_TYPES: dict[str, type[Any]] = {
    "session-open": SessionOpen, "session-state": SessionState, "assignment": Assignment, "proposal": Proposal,
    "verdict": Verdict, "output": Output, "status": Status, "event": Event, "policy": Policy,
}


def cddl_schema(rule: str) -> pycddl.Schema:
    text = (ROOT / "sdcp_fast" / "protocol" / "sdcp.cddl").read_text()
    # pycddl 0.6.4 mis-validates "[+ ladder]"; the inlined choice is equivalent (see tests/protocol/test_messages.py).
    text = text.replace("[+ ladder]", "[+ (a-reduce / a-switch / a-self-decode / a-fail)]")
    return pycddl.Schema(f"root = {rule}\n{text}")


def load(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((HERE / name).read_text())
    return data


def make_vectors() -> ModuleType:
    spec = importlib.util.spec_from_file_location("make_vectors", ROOT / "scripts" / "make_vectors.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", ["contracts.json", "prefix.json", "uniforms.json", "messages.json", "commitlog.json"])
def test_regeneration_reproduces_the_committed_file(name: str) -> None:
    assert make_vectors().render(name) == (HERE / name).read_text()


def test_check_mode_reports_no_stale_file() -> None:
    assert make_vectors().main(["--check"]) == 0


@pytest.mark.parametrize("vector", load("contracts.json")["valid"], ids=lambda v: v["name"])
def test_contract_vector(vector: dict[str, Any]) -> None:
    encoded = bytes.fromhex(vector["cbor"])
    expected = hashlib.sha256(b"SDCP-CONTRACT-1\x00" + encoded).digest().hex()
    assert vector["digest"] == expected
    contract = Contract.decode(encoded)
    assert contract.encode() == encoded
    assert contract_digest(contract).hex() == expected
    loose = Contract.decode(bytes.fromhex(vector["loose_cbor"]))
    assert loose == contract and contract_digest(loose.to_map()).hex() == expected
    assert cbor2.loads(bytes.fromhex(vector["loose_cbor"])) == cbor2.loads(encoded)
    if vector["name"] != "unknown-fallback-action":  # outside the CDDL's ladder by design
        cddl_schema("contract").validate_cbor(encoded)


@pytest.mark.parametrize("vector", load("contracts.json")["invalid"], ids=lambda v: v["name"])
def test_invalid_contract_vector(vector: dict[str, Any]) -> None:
    with pytest.raises(SdcpProblem) as info:
        Contract.decode(bytes.fromhex(vector["cbor"]))
    assert info.value.suffix == vector["problem"] == "sdcp-bad-contract"


@pytest.mark.parametrize("vector", load("prefix.json")["chains"], ids=lambda v: v["name"])
def test_prefix_chain_vector(vector: dict[str, Any]) -> None:
    cd = bytes.fromhex(vector["contract_digest"])
    prompt, output = vector["prompt"], vector["output"]
    d = hashlib.sha256(
        b"SDCP-PREFIX-1\x00" + cd + struct.pack(">I", len(prompt)) + b"".join(struct.pack(">I", t) for t in prompt)
    ).digest()
    by_hand = [d.hex()]
    for token in output:
        d = hashlib.sha256(d + struct.pack(">I", token)).digest()
        by_hand.append(d.hex())
    assert vector["d"] == by_hand
    d0 = prefix_digest(cd, prompt)
    assert d0.hex() == by_hand[0]
    assert extend_digest(d0, output).hex() == by_hand[-1]


def test_prefix_vectors_use_the_contract_vectors() -> None:
    digests = {v["digest"] for v in load("contracts.json")["valid"]}
    assert {v["contract_digest"] for v in load("prefix.json")["chains"]} <= digests


@pytest.mark.parametrize("vector", load("uniforms.json")["uniforms"], ids=lambda v: f"{v['seed']}-{v['round']}-{v['i']}")
def test_uniform_vector(vector: dict[str, Any]) -> None:
    session = bytes.fromhex(vector["session"])
    msg = (b"SDCP-VERIFY-1\x00" + session + struct.pack(">IIB", vector["round"], vector["i"], vector["purpose"]))
    mac = hmac.new(vector["seed"].to_bytes(8, "big"), msg, hashlib.sha256).digest()
    assert vector["bits53"] == int.from_bytes(mac[:8], "big") >> 11
    assert vector["value"] == vector["bits53"] / 2**53
    assert verifier_uniform(vector["seed"], session, vector["round"], vector["i"], vector["purpose"]) == vector["value"]


@pytest.mark.parametrize("vector", load("messages.json")["messages"], ids=lambda v: v["name"])
def test_message_vector(vector: dict[str, Any]) -> None:
    cls = MESSAGE_TYPES[vector["type"]]
    encoded = bytes.fromhex(vector["cbor"])
    msg = cls.decode(encoded)
    assert msg.encode() == encoded
    assert cls.decode(bytes.fromhex(vector["loose_cbor"])) == msg
    assert cbor.deterministic_cbor(cbor2.loads(encoded)) == encoded
    cddl_schema(vector["type"]).validate_cbor(encoded)


def test_every_message_type_has_a_vector() -> None:
    assert {v["type"] for v in load("messages.json")["messages"]} == set(MESSAGE_TYPES)


@pytest.mark.parametrize("vector", load("commitlog.json")["records"], ids=lambda v: v["name"])
def test_commit_log_record_vector(vector: dict[str, Any]) -> None:
    encoded = bytes.fromhex(vector["cbor"])
    assert encode_record(decode_record(encoded)) == encoded


def test_commit_log_vector_is_the_records_in_sequence() -> None:
    data = load("commitlog.json")
    log = decode_log(bytes.fromhex(data["log"]))
    assert [encode_record(r).hex() for r in log] == [v["cbor"] for v in data["records"]]
