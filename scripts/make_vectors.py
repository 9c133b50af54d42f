#!/usr/bin/env python3
"""Write the protocol test vectors under tests/vectors/ (see docs/vectors.md).

    python scripts/make_vectors.py            # rewrite the JSON files
    python scripts/make_vectors.py --check    # exit 1 if a file differs from what it would write

Every value is computed by sdcp_fast.protocol; tests/vectors/test_vectors.py checks that the
committed files still match the code and that writing them again changes nothing.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sdcp_fast.protocol import cbor
from sdcp_fast.protocol.commitlog import CommitRecord, FenceRecord, encode_record
from sdcp_fast.protocol.contract import contract_digest
from sdcp_fast.protocol.digests import extend_digest, prefix_digest
from sdcp_fast.protocol.messages import (
    Action,
    Assignment,
    Contract,
    Event,
    Output,
    Policy,
    Proposal,
    Resume,
    Sampling,
    SessionOpen,
    SessionState,
    Status,
    Verdict,
)
from sdcp_fast.protocol.problems import SdcpProblem
from sdcp_fast.protocol.randoms import VerifierRandom

OUT_DIR = Path(__file__).resolve().parent.parent / "tests" / "vectors"
U32 = (1 << 32) - 1
U64 = (1 << 64) - 1


def diag(value: Any) -> str:
    """RFC 8949 §8 diagnostic notation, keys in deterministic order: readable and unambiguous."""
    if value is True:
        return "true"
    if value is False:
        return "false"
    if value is None:
        return "null"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, bytes):
        return f"h'{value.hex()}'"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(diag(v) for v in value) + "]"
    items = sorted(value.items(), key=lambda kv: cbor.deterministic_cbor(kv[0]))
    return "{" + ", ".join(f"{diag(k)}: {diag(v)}" for k, v in items) + "}"


def loose_cbor(value: Any) -> bytes:
    """A valid but non-deterministic encoding: 8-byte integer heads, indefinite-length arrays,
    maps and strings, map keys in reverse insertion order. Decoders must accept it."""
    if value is True or value is False or value is None:
        return cbor.deterministic_cbor(value)
    if isinstance(value, int):
        major, arg = (0, value) if value >= 0 else (1, -1 - value)
        return bytes([major << 5 | 27]) + arg.to_bytes(8, "big")
    if isinstance(value, bytes):
        half = len(value) // 2
        return b"\x5f" + cbor.deterministic_cbor(value[:half]) + cbor.deterministic_cbor(value[half:]) + b"\xff"
    if isinstance(value, str):
        return b"\x7f" + cbor.deterministic_cbor(value) + b"\xff"
    if isinstance(value, (list, tuple)):
        return b"\x9f" + b"".join(loose_cbor(v) for v in value) + b"\xff"
    return b"\xbf" + b"".join(loose_cbor(k) + loose_cbor(v) for k, v in reversed(list(value.items()))) + b"\xff"


H = bytes.fromhex
SAMPLING_FULL = Sampling(temperature_milli=700, top_k=50, top_p_milli=900, seed=42)
MINIMAL = Contract(
    target=bytes(32), tokenizer=b"\x01" * 32, rule=1, m_max=4, max_new=128, stop=(), low_rounds=1, fallback=(5,),
)
CONTRACTS: list[tuple[str, Contract, str]] = [
    ("minimal-greedy", MINIMAL, "only the required members"),
    ("all-members", Contract(
        target=H("a3" * 32), tokenizer=H("5c" * 32), rule=2, m_max=8, max_new=512, stop=(2, 32000), low_rounds=3,
        fallback=(1, 3, 2, 5), drafters=(H("d1" * 32), H("d2" * 32)), sampling=SAMPLING_FULL, low_ratio=25,
        self_load=70, self_max=64, scope=bytes(range(16)),
    ), "every optional member present"),
    ("integer-heads", Contract(
        target=H("ff" * 32), tokenizer=H("00" * 31 + "01"), rule=2, m_max=64, max_new=U32, low_rounds=U32 + 1,
        stop=(0, 23, 24, 255, 256, 65535, 65536, U32, U32 + 1, U64), fallback=(1, 2, 3, 5), self_max=U64,
        sampling=Sampling(temperature_milli=24, top_k=U32, top_p_milli=1000, seed=U64),
        low_ratio=100, self_load=0,
    ), "integers at every head-size boundary, up to 2^64-1"),
    ("empty-sampling-and-zero-ratio", Contract(
        target=bytes(32), tokenizer=b"\x01" * 32, rule=1, m_max=4, max_new=128, stop=(), low_rounds=1,
        fallback=(5,), sampling=Sampling(), low_ratio=0,
    ), "present-but-default members differ from absent ones (compare minimal-greedy)"),
    ("unknown-fallback-action", Contract(
        target=bytes(32), tokenizer=b"\x01" * 32, rule=1, m_max=4, max_new=128, stop=(), low_rounds=2,
        fallback=(1, 6, 2),
    ), "sdcp_fast interpretation: an unregistered action value is kept for the digest and reads as fail"),
]

INVALID_CONTRACTS: list[tuple[str, dict[str, Any]]] = [
    ("unknown-key", {"priority": 1}),
    ("unknown-sampling-key", {"sampling": {"min_p_milli": 50}}),
    ("m_max-65", {"m_max": 65}),
    ("m_max-0", {"m_max": 0}),
    ("low_rounds-0", {"low_rounds": 0}),
    ("low_ratio-101", {"low_ratio": 101}),
    ("self_load-101", {"self_load": 101}),
    ("top_p_milli-1001", {"sampling": {"top_p_milli": 1001}}),
    ("rule-unregistered", {"rule": 3}),
    ("fallback-empty", {"fallback": []}),
    ("fallback-continue", {"fallback": [0]}),
    ("fallback-finish", {"fallback": [1, 4]}),
    ("target-31-bytes", {"target": bytes(31)}),
    ("scope-15-bytes", {"scope": bytes(15)}),
    ("drafters-empty", {"drafters": []}),
    ("stop-negative", {"stop": [-1]}),
    ("max_new-text", {"max_new": "128"}),
]


def contract_vectors() -> dict[str, Any]:
    valid = []
    for name, contract, note in CONTRACTS:
        raw = contract.to_map()
        valid.append({
            "name": name, "note": note, "diagnostic": diag(raw),
            "cbor": contract.encode().hex(), "loose_cbor": loose_cbor(raw).hex(),
            "digest": contract_digest(contract).hex(),
        })
    invalid = []
    for name, change in INVALID_CONTRACTS:
        raw = {**MINIMAL.to_map(), **change}
        try:
            Contract.from_map(raw)
        except SdcpProblem as problem:
            invalid.append({"name": name, "diagnostic": diag(raw), "cbor": cbor.deterministic_cbor(raw).hex(),
                            "problem": problem.suffix})
        else:
            raise AssertionError(f"invalid contract {name} was accepted")
    return {"valid": valid, "invalid": invalid}


def prefix_vectors() -> dict[str, Any]:
    cases = [
        ("empty-prompt", MINIMAL, [], [7]),
        ("short", MINIMAL, [1, 2, 3], [4, 5, U32]),
        ("uint32-edges", CONTRACTS[1][1], [0, U32, 65536, 255], [0, 0, 1]),
        # Knuth's multiplicative hash spreads the ids over the whole uint32 range.
        ("long-prompt", CONTRACTS[1][1], [(i * 2654435761) % (1 << 32) for i in range(1000)],
         [(i * 40503) % 50000 for i in range(1, 41)]),
    ]
    out = []
    for name, contract, prompt, output in cases:
        cd = contract_digest(contract)
        d = prefix_digest(cd, prompt)
        chain = [d.hex()]
        for token in output:
            d = extend_digest(d, [token])
            chain.append(d.hex())
        out.append({"name": name, "contract_digest": cd.hex(), "prompt": prompt, "output": output, "d": chain})
    return {"chains": out}


def uniform_vectors() -> dict[str, Any]:
    cases = [
        (0, bytes(16), 1, 1, 0), (0, bytes(16), 1, 1, 1), (1, bytes(16), 1, 1, 0),
        (42, bytes(range(16)), 1, 1, 0), (42, bytes(range(16)), 1, 2, 0), (42, bytes(range(16)), 1, 3, 0),
        (42, bytes(range(16)), 1, 3, 1), (42, bytes(range(16)), 2, 1, 0), (42, bytes(range(16)), 2, 5, 1),
        (U64, H("ff" * 16), U32, U32, 1), (2**32, H("0123456789abcdef0123456789abcdef"), 1000, 65, 0),
        (7, H("5d" * 16), 0, 0, 0),
    ]
    out = []
    for seed, session, round_, i, purpose in cases:
        value = VerifierRandom(seed, session).uniform(round_, i, purpose)
        out.append({"seed": seed, "session": session.hex(), "round": round_, "i": i, "purpose": purpose,
                    "bits53": int(value * 2**53), "value": value})
    return {"uniforms": out}


def message_vectors() -> dict[str, Any]:
    sid = bytes(range(16))
    status = Status(instance="https://drafter-1.example", role=1, load=35, queue=2, ttl_ms=3000,
                    accept_milli=812, cache_mbps=2500)
    contract = CONTRACTS[1][1]
    messages: list[tuple[str, Any]] = [
        ("session-open", SessionOpen(session=sid, epoch=1, contract=MINIMAL, prompt=(1, 2, 3),
                                     commit_log="mlc://log/s1")),
        ("session-open-resume", SessionOpen(
            session=sid, epoch=2, contract=contract, prompt="mlc://prompt/s1", commit_log="mlc://log/s1",
            prompt_kv="mlc://kv/p", resume=Resume(round=9, committed=17, digest=H("ab" * 32),
                                                  committed_tokens="mlc://out/s1", target_kv="mlc://kv/t"))),
        ("session-state", SessionState(session=sid, epoch=1, round=0, committed=0, digest=H("cd" * 32))),
        ("assignment", Assignment(
            session=sid, epoch=1, contract=contract, verifier="https://verifier.example/",
            drafter="https://drafter-1.example/", prompt=(1, 2, 3), round=4, committed=9, digest=H("cd" * 32),
            m_init=4, sampling=Sampling(temperature_milli=0), committed_tokens="mlc://out/s1")),
        ("proposal", Proposal(session=sid, epoch=1, round=5, drafter="https://drafter-1.example/", base=9,
                              base_digest=H("cd" * 32), tokens=(11, 12, 13, 14), status=status,
                              q_rows="mlc://q/s1/5", draft_kv="mlc://kv/d")),
        ("verdict", Verdict(session=sid, epoch=1, round=5, accepted=2, emitted=(11, 12, 99), committed=12,
                            digest=H("ef" * 32), action=Action.REDUCE, m_cap=2, low=0, load=64)),
        ("output", Output(session=sid, epoch=1, from_=9, tokens=(11, 12, 99), final=False)),
        ("output-final", Output(session=sid, epoch=1, from_=12, tokens=(), final=True, finish=Action.FINISH)),
        ("status", status),
        ("event", Event(session=sid, epoch=1, kind=Action.SWITCH, committed=12, digest=H("ef" * 32))),
        ("policy", Policy(session=sid, from_round=7, sampling=SAMPLING_FULL)),
    ]
    out = []
    for name, msg in messages:
        raw = msg.to_map()
        out.append({"name": name, "type": name.split("-resume")[0].removesuffix("-final"),
                    "diagnostic": diag(raw), "cbor": msg.encode().hex(), "loose_cbor": loose_cbor(raw).hex()})
    return {"messages": out}


def record_vectors() -> dict[str, Any]:
    records = [
        ("fence", FenceRecord(epoch=2)),
        ("commit", CommitRecord(epoch=1, round=5, emitted=(11, 12, 99), committed=12, digest=H("ef" * 32))),
        ("commit-empty", CommitRecord(epoch=U32 + 1, round=6, emitted=(), committed=12, digest=H("ef" * 32))),
    ]
    out = [{"name": name, "cbor": encode_record(r).hex(), "diagnostic": diag(cbor.decode(encode_record(r)))}
           for name, r in records]
    return {"records": out, "log": b"".join(encode_record(r) for _, r in records).hex()}


FILES: dict[str, Callable[[], dict[str, Any]]] = {
    "contracts.json": contract_vectors,
    "prefix.json": prefix_vectors,
    "uniforms.json": uniform_vectors,
    "messages.json": message_vectors,
    "commitlog.json": record_vectors,
}


def render(name: str) -> str:
    body = {"generated_by": "scripts/make_vectors.py", "spec": "draft SDCP, November 2026", **FILES[name]()}
    return json.dumps(body, indent=1, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    args = parser.parse_args(argv)
    stale = []
    for name in FILES:
        path = OUT_DIR / name
        text = render(name)
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        else:
            path.write_text(text)
    if stale:
        print("out of date: " + ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
