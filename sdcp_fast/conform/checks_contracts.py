"""Checks without a session of the kit's own: the transport (§5.1), who may call what (§5.1,
§6.1, §6.3), and contracts (§4.1, §4.2) including the published vectors."""

from __future__ import annotations

import hashlib
import json
import os
from typing import TYPE_CHECKING, Any

from sdcp_fast.conform.client import prompt_tokens
from sdcp_fast.conform.report import Outcome
from sdcp_fast.protocol import (
    Contract,
    Policy,
    Sampling,
    SessionState,
    cbor,
    contract_digest,
    extend_digest,
    prefix_digest,
)

if TYPE_CHECKING:
    from sdcp_fast.conform.checker import Checker

# Valid vectors a verifier may refuse as "not supported" (Table 2), and invalid ones it may
# accept, because the draft leaves that reading to it (docs/vectors.md).
BASELINE_VALID = "minimal-greedy"
INVALID_BY_INTERPRETATION = {"m_max-0": "the CDDL allows m_max 0 (uint .le 64); refusing it is an interpretation"}


async def transport(kit: Checker) -> None:
    """§5.1 on sockets of the kit's own (the CLI's probe: TLS 1.2 only, HTTP/1.1 only)."""
    r = kit.report
    if kit.probe is None:
        for check in ("tls13-only", "h2-only"):
            r.add(check, None, "needs a network connection of the kit's own (the command line's)")
    else:
        for check, (ok, detail) in (await kit.probe()).items():
            r.add(check, ok, detail)
    if kit.stranger is None:
        r.add("mutual-tls", None, "needs a network connection without a client certificate")
        return
    try:
        answer = await kit.stranger("GET", "health", b"")
        r.add("mutual-tls", answer.status in (401, 403), f"answered {answer.status} without a client certificate")
    except Exception as exc:  # the handshake itself refused us: what we want
        r.add("mutual-tls", True, f"refused: {type(exc).__name__}")


async def authentication(kit: Checker) -> None:
    r = kit.report
    answer = await kit.as_drafter("POST", "sessions", kit.session_open(kit.contract()).encode())
    served = answer.status == 200
    r.add("router-only", Outcome.INTERPRETATION if served else answer.status == 403,
          f"a drafter certificate opening a session {answer.brief()}")
    session = os.urandom(16)
    from sdcp_fast.protocol import session_path_id

    answer = await kit.as_drafter("POST", f"sessions/{session_path_id(session)}/policy",
                                  Policy(session=session, from_round=5, sampling=Sampling(temperature_milli=0)).encode())
    r.add("router-only", Outcome.INTERPRETATION if answer.status == 200 else 400 <= answer.status < 500,
          f"a drafter certificate posting a policy {answer.brief()}")
    answer = await kit.as_router("POST", "sessions", b"\xa1\x61")
    r.add("problem-details", 400 <= answer.status < 500 and answer.suffix is not None,
          f"a malformed session-open {answer.brief()}")
    unknown = await kit.output(os.urandom(16), 0)
    r.add("unknown-session", 400 <= unknown.status < 500 and unknown.suffix is not None,
          f"output of an unknown session {unknown.brief()}")


async def contracts(kit: Checker) -> None:
    r = kit.report
    reference_digests(kit)
    wrong = kit.contract(target=hashlib.sha256(b"not the verifier's model").digest())
    kit.refused("wrong-target", await kit.post_session(kit.session_open(wrong)), 422, "sdcp-bad-contract")
    m = kit.session_open(kit.contract()).to_map()
    m["contract"]["x-unknown"] = 1
    kit.refused("unknown-contract-key", await kit.as_router("POST", "sessions", cbor.deterministic_cbor(m)),
                422, "sdcp-bad-contract")
    m = kit.session_open(kit.contract()).to_map()
    m["contract"]["m_max"] = 65
    kit.refused("m-max-65", await kit.as_router("POST", "sessions", cbor.deterministic_cbor(m)),
                422, "sdcp-bad-contract")
    if kit.target_digest is None:
        r.add("valid-contracts", None, "give --target-digest: the vectors open sessions")
        r.add("invalid-contracts", None, "give --target-digest: only the vector's one defect may differ")
        return
    await contract_vectors(kit)


def _vector_file(kit: Checker, name: str) -> dict[str, Any] | None:
    if kit.vectors is None:
        return None
    try:
        with open(os.path.join(kit.vectors, name)) as f:
            data: dict[str, Any] = json.load(f)
    except OSError:
        return None
    return data


def reference_digests(kit: Checker) -> None:
    """The digests the kit judges with reproduce the published vectors (§4.1, §4.2)."""
    contracts, prefix = _vector_file(kit, "contracts.json"), _vector_file(kit, "prefix.json")
    if contracts is None or prefix is None:
        kit.report.add("reference-digests", None, "no vectors folder (--vectors DIR: tests/vectors of sdcp_fast)")
        return
    bad = [v["name"] for v in contracts["valid"]
           if contract_digest(Contract.decode(bytes.fromhex(v["cbor"]))).hex() != v["digest"]]
    for chain in prefix["chains"]:
        d = [prefix_digest(bytes.fromhex(chain["contract_digest"]), tuple(chain["prompt"]))]
        for token in chain["output"]:
            d.append(extend_digest(d[-1], (token,)))
        if [x.hex() for x in d] != chain["d"]:
            bad.append(chain["name"])
    uniforms = _vector_file(kit, "uniforms.json")
    if uniforms is not None:  # §6.4's HMAC draws, which the seeded rule-2 rounds predict
        from sdcp_fast.protocol.randoms import VerifierRandom

        bad += [f"uniform {n}" for n, u in enumerate(uniforms["uniforms"])
                if VerifierRandom(u["seed"], bytes.fromhex(u["session"])).uniform(u["round"], u["i"], u["purpose"])
                != u["value"]]
    kit.report.add("reference-digests", not bad, ", ".join(bad))


async def contract_vectors(kit: Checker) -> None:
    """contracts.json with the verifier's own target: a valid contract opens a session whose
    d[0] follows its digest, or (all but the baseline) is refused as not supported; an invalid
    one is refused with its published problem, or accepted where that is an interpretation."""
    r = kit.report
    contracts = _vector_file(kit, "contracts.json")
    if contracts is None:
        r.add("valid-contracts", None, "no vectors folder")
        r.add("invalid-contracts", None, "no vectors folder")
        return
    assert kit.target_digest is not None
    for v in contracts["valid"]:
        m = cbor.decode(bytes.fromhex(v["cbor"]))
        m["target"] = kit.target_digest
        opened = kit.session_open(Contract.from_map(m))
        answer = await kit.post_session(opened)
        if answer.status == 200:
            expected = prefix_digest(contract_digest(opened.contract), prompt_tokens(opened.prompt))
            r.add("valid-contracts", SessionState.decode(answer.body).digest == expected, f"{v['name']}: d[0]")
        elif v["name"] != BASELINE_VALID and answer.status == 422 and answer.suffix == "sdcp-bad-contract":
            r.add("valid-contracts", Outcome.INTERPRETATION, f"{v['name']} not supported ({answer.brief()})")
        else:
            r.add("valid-contracts", False, f"{v['name']}: {answer.brief()}")
    for v in contracts["invalid"]:
        m = cbor.decode(bytes.fromhex(v["cbor"]))
        if isinstance(m.get("target"), bytes) and len(m["target"]) == 32:
            m["target"] = kit.target_digest  # only the vector's one defect is left
        body = kit.session_open(kit.contract()).to_map()
        body["contract"] = m
        answer = await kit.as_router("POST", "sessions", cbor.deterministic_cbor(body))
        if answer.status == 200 and v["name"] in INVALID_BY_INTERPRETATION:
            r.add("invalid-contracts", Outcome.INTERPRETATION,
                  f"{v['name']} accepted: {INVALID_BY_INTERPRETATION[v['name']]}")
        else:
            kit.refused("invalid-contracts", answer, 422, v["problem"], v["name"])

