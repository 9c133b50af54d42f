"""The round vectors against independent.py, a derivation from the draft alone: the files are
written by sdcp_fast.protocol (scripts/make_round_vectors.py), so comparing them with that
code only shows it still agrees with itself; this shows both agree with §4.1, §4.2, §6.3, §6.4."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import cbor2
import pytest

from . import independent as ind

HERE = Path(__file__).resolve().parent
FILES = {name: json.loads((HERE / name).read_text()) for name in ("rounds_rule1.json", "rounds_rule2.json")}
SESSIONS = [(name, k) for name, data in FILES.items() for k in range(len(data["sessions"]))]


def _check_verdict(case: dict[str, Any], rnd: dict[str, Any], emitted: list[int], committed: int,
                   digest: bytes) -> None:
    raw = bytes.fromhex(rnd["verdict_cbor"])
    verdict = cbor2.loads(raw)
    assert ind.cbor(verdict) == raw, "the verdict is not in the core deterministic encoding"
    assert (verdict["session"], verdict["round"], verdict["accepted"], verdict["emitted"], verdict["committed"],
            verdict["digest"]) == (bytes.fromhex(case["session"]), rnd["round"], rnd["accepted"], emitted,
                                   committed, digest)
    assert 0 <= verdict["accepted"] <= len(rnd["proposed"])


@pytest.mark.parametrize(("name", "index"), SESSIONS, ids=[f"{n}-{k}" for n, k in SESSIONS])
def test_round_vectors_follow_the_draft(name: str, index: int) -> None:
    case = FILES[name]["sessions"][index]
    contract = ind.contract_from_json(case["contract"])
    digest_c = ind.contract_digest(contract)
    assert digest_c.hex() == case["contract_digest"]
    digest = ind.prefix_digest(digest_c, case["prompt"])
    assert digest.hex() == case["d0"]
    session = bytes.fromhex(case["session"])
    sampling = contract.get("sampling", {})
    committed = 0
    for number, rnd in enumerate(case["rounds"], start=1):
        assert (rnd["round"], rnd["base"], rnd["base_digest"]) == (number, committed, digest.hex())
        proposed = rnd["proposed"]
        if contract["rule"] == 1:
            accepted, extra = ind.rule1(rnd["logits"], proposed)
        else:
            p = [ind.profile(row, sampling) for row in rnd["logits"]]
            assert all(abs(a - b) <= 1e-12 for mine, theirs in zip(p, rnd["p"], strict=True)
                       for a, b in zip(mine, theirs, strict=True))
            assert all(mine > 0 for row, theirs in zip(p, rnd["p"], strict=True)
                       for mine, t in zip(row, theirs, strict=True) if t > 0)
            u = [[ind.uniform(sampling["seed"], session, number, i, k) for k in (0, 1)]
                 for i in range(1, len(proposed) + 2)]
            assert rnd["uniforms"] == u  # bit-exact: the HMAC fixes every bit of each value
            accepted, extra = ind.rule2(p, rnd["q"], proposed, u)
        assert (rnd["accepted"], rnd["next_token"]) == (accepted, extra), rnd.get("note")
        out = ind.emitted(proposed, accepted, extra, contract["stop"], contract["max_new"], committed)
        assert rnd["emitted"] == out, rnd.get("note")
        committed += len(out)
        digest = ind.extend(digest, out)
        assert (rnd["committed"], rnd["digest"]) == (committed, digest.hex())
        _check_verdict(case, rnd, out, committed, digest)


BIASED_RESIDUALS = {
    "p": lambda a, b: a,
    "|p - q|": lambda a, b: abs(a - b),
    "max(p - 0.9q, 0)": lambda a, b: max(0.0, a - 0.9 * b),
}


@pytest.mark.parametrize("residual", list(BIASED_RESIDUALS))
def test_vectors_catch_a_biased_residual(residual: str) -> None:
    """An implementation drawing the additional token from a wrong residual fails the rule-2
    vectors (the "residual draws" session exists for this)."""
    changed = []
    for case in FILES["rounds_rule2.json"]["sessions"]:
        for rnd in case["rounds"]:
            got = ind.rule2(rnd["p"], rnd["q"], rnd["proposed"], rnd["uniforms"], BIASED_RESIDUALS[residual])
            if got != (rnd["accepted"], rnd["next_token"]):
                changed.append((case["note"], rnd["round"]))
    assert changed


def test_zero_q_is_refused_before_any_draw() -> None:
    for refused in FILES["rounds_rule2.json"]["refused"]:
        zero = [refused["q"][i][x] == 0 for i, x in enumerate(refused["proposed"])]
        assert any(zero) and refused["problem"] == "sdcp-bad-proposal"


def test_independent_rules_on_known_values() -> None:
    """The derivation itself, on values worked out by hand."""
    assert ind.cbor({"bb": 1, "a": [2, b"\x01"], "c": -1}) == bytes.fromhex("a3") + b"\x61a\x82\x02\x41\x01" + \
        b"\x61c\x20" + b"\x62bb\x01"
    assert ind.cbor(2**64 - 1) == b"\x1b" + b"\xff" * 8
    assert ind.profile([1.0, 3.0, 3.0, 0.0], {"temperature_milli": 0}) == [0.0, 1.0, 0.0, 0.0]
    assert ind.profile([1.0, 3.0, 3.0, 0.0], {"top_k": 2})[0] == 0.0
    p = ind.profile([0.0, 0.0, 0.0, 0.0], {"top_p_milli": 500})
    assert p == [0.5, 0.5, 0.0, 0.0]  # mass 0.5 reaches top_p 0.5 after two tokens
    assert ind.draw([0.25, 0.0, 0.75], 0.25) == 2 and ind.draw([0.25, 0.0, 0.75], 0.2499) == 0
    assert ind.rule1([[0.0, 1.0], [1.0, 1.0]], [1]) == (1, 0)
    assert ind.rule2([[0.5, 0.5], [1.0, 0.0]], [[0.25, 0.75]], [1], [[0.7, 0.1], [0.0, 0.0]]) == (0, 0)
    assert ind.emitted([4, 7, 5], 3, 6, [7], 100, 0) == [4, 7]
    assert ind.emitted([4, 5], 2, 6, [], 4, 2) == [4, 5]
    assert 0.0 <= ind.uniform(2**64 - 1, b"\x00" * 16, 1, 1, 0) < 1.0
