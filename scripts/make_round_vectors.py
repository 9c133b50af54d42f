#!/usr/bin/env python3
"""Write whole-round test vectors: tests/vectors/rounds_rule1.json and rounds_rule2.json.

    python scripts/make_round_vectors.py            # rewrite both files
    python scripts/make_round_vectors.py --check    # exit 1 if a file differs from what it would write

Each round is run through the pure-Python reference (sdcp_fast.protocol.acceptance) and a
VerifierSession, so a vector fixes: target logits (float32-exact), the sampling profile, the
proposal, for rule 2 the draft rows q and the seeded uniforms of §6.4, and then what must
come out: p after the profile, accepted, the additional token, the emitted tokens after
truncation, n, d[n], the action and the verdict's deterministic CBOR. Rule-2 inputs are
drawn until every comparison (r against p/q, the inverse-CDF boundaries, the top-p cut) is
at least MARGIN away from a tie, so float32 kernels must reproduce them exactly.
tests/vectors/test_round_vectors.py checks the files against the code and the kernels.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import struct
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sdcp_fast.protocol.acceptance import greedy, inverse_cdf, profile_distribution, speculative
from sdcp_fast.protocol.contract import contract_digest
from sdcp_fast.protocol.messages import Assignment, Contract, Proposal, Sampling, SessionOpen, Status
from sdcp_fast.protocol.problems import SdcpProblem
from sdcp_fast.protocol.randoms import VerifierRandom
from sdcp_fast.protocol.session import RoundDone, ScoreNeeded, VerifierSession

OUT_DIR = Path(__file__).resolve().parent.parent / "tests" / "vectors"
MARGIN = 1e-4
VOCAB = 8
TARGET = bytes.fromhex("5d" * 32)
TOKENIZER = bytes.fromhex("70" * 32)
DRAFTER = "https://drafter.example/"
STATUS = Status(instance=DRAFTER, role=1, load=0, queue=0, ttl_ms=1000)


def f32(x: float) -> float:
    return float(struct.unpack("<f", struct.pack("<f", x))[0])


def jsonable(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return value


def open_session(contract: Contract, sid: bytes, prompt: Sequence[int]) -> VerifierSession:
    session, state = VerifierSession.open(
        SessionOpen(session=sid, epoch=1, contract=contract, prompt=tuple(prompt), commit_log="mlc://log"),
        target_digest=TARGET)
    session.assign(Assignment(session=sid, epoch=1, contract=contract, verifier="https://verifier.example/",
                              drafter=DRAFTER, prompt=tuple(prompt), round=0, committed=0,
                              digest=state.digest, m_init=contract.m_max))
    return session


def run_round(session: VerifierSession, proposed: Sequence[int], accepted: int, next_token: int,
              q_of_x: Sequence[float] | None = None) -> tuple[dict[str, Any], Any]:
    base, base_digest = session.committed, session.digest
    work = session.receive_proposal(
        Proposal(session=session.session, epoch=1, round=session.round + 1, drafter=DRAFTER, base=base,
                 base_digest=base_digest, tokens=tuple(proposed), status=STATUS,
                 q_rows="mlc://q" if q_of_x is not None else None),
        client=DRAFTER, now=0.0)
    assert isinstance(work, ScoreNeeded)
    uniforms = session.provide_q(q_of_x) if q_of_x is not None else None
    session.complete_scoring(accepted, next_token)
    done = session.append_done(ok=True)
    assert isinstance(done, RoundDone)
    v = done.verdict
    out = {
        "round": v.round, "base": base, "base_digest": base_digest.hex(), "proposed": list(proposed),
        "accepted": v.accepted, "next_token": next_token, "emitted": list(v.emitted),
        "committed": v.committed, "digest": v.digest.hex(), "action": int(v.action),
        "verdict_cbor": v.encode().hex(),
    }
    return out, uniforms


# -- rule 1 ---------------------------------------------------------------------------------

def rule1_row(rng: random.Random, winner: int, tie_with: int | None = None) -> list[float]:
    row = [f32(rng.uniform(-2.0, 2.0)) for _ in range(VOCAB)]
    row[winner] = f32(max(row) + 1.5)
    if tie_with is not None:
        row[tie_with] = row[winner]
    return row


def rule1_vectors() -> dict[str, Any]:
    rng = random.Random(20261130)
    contract = Contract(target=TARGET, tokenizer=TOKENIZER, rule=1, m_max=4, max_new=16, stop=(7,),
                        low_rounds=2, fallback=(1, 2, 5))
    sid = b"rule-1-vectors!!"
    prompt = (1, 2, 3, 4)
    session = open_session(contract, sid, prompt)
    # (proposed, argmax per row, tie partner per row): full, partial, none, a tie, a stop token.
    plans: list[tuple[list[int], list[int], list[int | None], str]] = [
        ([3, 5, 6], [3, 5, 6, 2], [None] * 4, "all accepted, extra from row M+1"),
        ([1, 4, 0], [1, 2, 0, 5], [None] * 4, "first mismatch at position 2"),
        ([6, 6], [0, 6, 6], [None] * 3, "nothing accepted"),
        ([4, 1], [4, 1, 2], [None, 3, 5], "ties go to the smallest id (x[2] = 1 ties with 3)"),
        ([5, 7, 2, 2], [5, 7, 2, 2, 2], [None] * 5, "stop token 7 accepted: emitted truncated after it"),
    ]
    rounds = []
    for proposed, winners, ties, note in plans:
        logits = [rule1_row(rng, w, t if t is not None and t > w else None) for w, t in zip(winners, ties, strict=True)]
        result = greedy(logits, proposed)
        vec, _ = run_round(session, proposed, result.accepted, result.next_token)
        rounds.append({"note": note, "logits": logits, **vec})
    capped = open_session(Contract(target=TARGET, tokenizer=TOKENIZER, rule=1, m_max=4, max_new=3, stop=(),
                                   low_rounds=1, fallback=(1, 5)), sid, prompt)
    logits = [rule1_row(rng, w) for w in (1, 2, 3, 4)]
    result = greedy(logits, [1, 2, 3])
    vec, _ = run_round(capped, [1, 2, 3], result.accepted, result.next_token)
    return {
        "description": "Rule 1 rounds (§6.3, §6.4): logits rows 1..M+1 of each round, ids 0..V-1.",
        "vocab": VOCAB,
        "sessions": [
            {"session": sid.hex(), "prompt": list(prompt), "contract": jsonable(contract.to_map()),
             "contract_digest": contract_digest(contract).hex(), "d0": session.digest0.hex(),
             "rounds": rounds},
            {"session": sid.hex(), "prompt": list(prompt), "contract": jsonable(capped.contract.to_map()),
             "contract_digest": contract_digest(capped.contract).hex(), "d0": capped.digest0.hex(),
             "rounds": [{"note": "max_new = 3: emitted truncated to 3 tokens", "logits": logits, **vec}]},
        ],
    }


# -- rule 2 ---------------------------------------------------------------------------------

def normalized_f32(weights: Sequence[float]) -> list[float]:
    total = math.fsum(weights)
    return [f32(w / total) for w in weights]


def cdf_margin(weights: Sequence[float], u: float) -> float:
    total = math.fsum(weights)
    target, acc, gap = u * total, 0.0, math.inf
    for w in weights:
        if w > 0.0:
            acc += w
            gap = min(gap, abs(target - acc) / total)
    return gap


def top_p_margin(logits: Sequence[float], s: Sampling) -> float:
    if s.top_p_milli is None or s.top_p_milli >= 1000:
        return math.inf
    p = profile_distribution(logits, Sampling(temperature_milli=s.temperature_milli, top_k=s.top_k))
    acc, gap = 0.0, math.inf
    for x in sorted(p, reverse=True):
        acc += x
        gap = min(gap, abs(acc - s.top_p_milli / 1000.0))
    return gap


def rule2_margin(p: list[list[float]], q: list[list[float]], proposed: Sequence[int], uniform: Any) -> float:
    gap = math.inf
    for i, x in enumerate(proposed, start=1):
        ratio = min(1.0, p[i - 1][x] / q[i - 1][x])
        r = uniform(i, 0)
        gap = min(gap, abs(r - ratio) if ratio < 1.0 else 1.0 - r)
        if not r < ratio:
            residual = [max(0.0, a - b) for a, b in zip(p[i - 1], q[i - 1], strict=True)]
            return min(gap, cdf_margin(residual, uniform(i, 1)))
    return min(gap, cdf_margin(p[len(proposed)], uniform(len(proposed) + 1, 1)))


PROFILES: list[tuple[str, Sampling]] = [
    ("no profile", Sampling(seed=1)),
    ("temperature 0.7", Sampling(temperature_milli=700, seed=2)),
    ("top-k 3", Sampling(top_k=3, seed=3)),
    ("top-p 0.8", Sampling(top_p_milli=800, seed=4)),
    ("temperature 1.3, top-k 5, top-p 0.9", Sampling(temperature_milli=1300, top_k=5, top_p_milli=900, seed=5)),
    ("large seed", Sampling(seed=(1 << 64) - 1)),
]


# Wrong residuals a rule-2 implementation could use (STYLE.md, "Statistical tests for sampling").
BIASED_RESIDUALS = {
    "p": lambda a, b: a,
    "|p - q|": lambda a, b: abs(a - b),
    "max(p - 0.9q, 0)": lambda a, b: max(0.0, a - 0.9 * b),
}


def residual_draw_is_telling(p: list[list[float]], q: list[list[float]], proposed: Sequence[int],
                             uniform: Any) -> bool:
    """True if the round rejects a position and each biased residual would draw another token there."""
    for i, x in enumerate(proposed, start=1):
        if uniform(i, 0) < min(1.0, p[i - 1][x] / q[i - 1][x]):
            continue
        u = uniform(i, 1)
        exact = inverse_cdf([max(0.0, a - b) for a, b in zip(p[i - 1], q[i - 1], strict=True)], u)
        return all(inverse_cdf([f(a, b) for a, b in zip(p[i - 1], q[i - 1], strict=True)], u) != exact
                   for f in BIASED_RESIDUALS.values())
    return False


def rule2_round(rng: random.Random, session: VerifierSession, sampling: Sampling, m: int,
                proposer_bias: float, telling: bool = False) -> dict[str, Any]:
    rnd = VerifierRandom(sampling.seed, session.session)
    round_no = session.round + 1
    for _ in range(1000):
        logits = [[f32(rng.gauss(0.0, 1.5)) for _ in range(VOCAB)] for _ in range(m + 1)]
        if any(top_p_margin(row, sampling) < MARGIN for row in logits):
            continue
        p = [profile_distribution(row, sampling) for row in logits]
        # Draft rows: a blend of p and noise, so that some tokens are accepted and some not.
        q = [normalized_f32([proposer_bias * a + (1 - proposer_bias) * rng.random() for a in row]) for row in p[:m]]
        proposed = [rng.choices(range(VOCAB), weights=row)[0] for row in q]
        if any(q[k][x] <= 0.0 for k, x in enumerate(proposed)):
            continue

        def uniform(i: int, purpose: int) -> float:
            return rnd.uniform(round_no, i, purpose)

        if rule2_margin(p, q, proposed, uniform) < MARGIN:
            continue
        if telling and not residual_draw_is_telling(p, q, proposed, uniform):
            continue
        result = speculative(p, q, proposed, uniform)
        vec, uniforms = run_round(session, proposed, result.accepted, result.next_token,
                                  [q[k][x] for k, x in enumerate(proposed)])
        assert uniforms is not None and all(
            uniforms(i, k) == uniform(i, k) for i in range(1, m + 2) for k in (0, 1))
        return {"logits": logits, "p": p, "q": q,
                "uniforms": [[uniform(i, 0), uniform(i, 1)] for i in range(1, m + 2)], **vec}
    raise RuntimeError("no inputs with enough margin")


def rule2_vectors() -> dict[str, Any]:
    rng = random.Random(6_4_2)
    cases = []
    for index, (note, sampling) in enumerate(PROFILES):
        contract = Contract(target=TARGET, tokenizer=TOKENIZER, rule=2, m_max=4, max_new=64, stop=(),
                            low_rounds=3, fallback=(1, 2, 5), sampling=sampling)
        sid = bytes([0x52, index]) + b"rule-2-vectors"
        prompt = (9, 8, 7)
        session = open_session(contract, sid, prompt)
        rounds = [rule2_round(rng, session, sampling, m, bias) for m, bias in ((3, 0.9), (4, 0.5), (2, 0.97))]
        cases.append({"note": note, "session": sid.hex(), "prompt": list(prompt),
                      "sampling": jsonable(sampling.to_map()), "contract": jsonable(contract.to_map()),
                      "contract_digest": contract_digest(contract).hex(), "d0": session.digest0.hex(),
                      "rounds": rounds})
    # Rounds whose additional token each biased residual would change, so that an
    # implementation drawing from p, |p - q| or max(p - 0.9q, 0) fails these vectors.
    sampling = Sampling(seed=6)
    contract = Contract(target=TARGET, tokenizer=TOKENIZER, rule=2, m_max=4, max_new=64, stop=(),
                        low_rounds=3, fallback=(1, 2, 5), sampling=sampling)
    sid = b"rule-2-residual!"
    session = open_session(contract, sid, (9, 8, 7))
    rounds = [rule2_round(rng, session, sampling, m, bias, telling=True) for m, bias in ((1, 0.9), (2, 0.8), (3, 0.95))]
    cases.append({"note": "residual draws: p, |p - q| and max(p - 0.9q, 0) would each emit another token",
                  "session": sid.hex(), "prompt": [9, 8, 7], "sampling": jsonable(sampling.to_map()),
                  "contract": jsonable(contract.to_map()), "contract_digest": contract_digest(contract).hex(),
                  "d0": session.digest0.hex(), "rounds": rounds})
    # A zero q(x[i]) is refused before any random value is drawn.
    contract = Contract(target=TARGET, tokenizer=TOKENIZER, rule=2, m_max=4, max_new=64, stop=(),
                        low_rounds=3, fallback=(1,), sampling=Sampling(seed=9))
    sid = b"rule-2-bad-q!!!!"
    session = open_session(contract, sid, (1,))
    session.receive_proposal(Proposal(session=sid, epoch=1, round=1, drafter=DRAFTER, base=0,
                                      base_digest=session.digest, tokens=(2, 5), status=STATUS,
                                      q_rows="mlc://q"), client=DRAFTER, now=0.0)
    q = [[0.125] * VOCAB, [0.25] * 4 + [0.0] * 4]
    problem = ""
    try:
        session.provide_q([q[0][2], q[1][5]])
    except SdcpProblem as exc:
        problem = exc.suffix
    return {
        "description": ("Rule 2 rounds (§6.3, §6.4): float32-exact logits and q rows; p is the profile "
                        "(§4.1) in float64; uniforms[i-1] = [purpose 0, purpose 1] of position i; every "
                        f"decision is at least {MARGIN} away from a tie."),
        "vocab": VOCAB, "margin": MARGIN, "sessions": cases,
        "refused": [{"note": "q[2](x[2]) = 0", "session": sid.hex(), "proposed": [2, 5], "q": q,
                     "problem": problem}],
    }


def render(data: dict[str, Any]) -> str:
    return json.dumps(data, indent=1, sort_keys=True) + "\n"


FILES = {"rounds_rule1.json": rule1_vectors, "rounds_rule2.json": rule2_vectors}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    args = parser.parse_args(argv)
    stale = []
    for name, build in FILES.items():
        text = render(build())
        path = OUT_DIR / name
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        else:
            path.write_text(text)
    if stale:
        print("stale:", ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
