"""What a round must produce, written from the draft (../shared/spec/sdcp-draft.txt) alone.

Imports nothing of sdcp_fast, so the round vectors (made by sdcp_fast.protocol through
scripts/make_round_vectors.py) are checked against a second derivation, not against the code
that wrote them. Sections: §4.1 contract digest and sampling profile, §4.2 digest chain,
§6.3 truncation, §6.4 rules 1 and 2 and the seeded HMAC randoms.

The draft leaves three details open; this module takes them from docs/interpretations.md
("Sampling profile and acceptance reference"): ranking for top-k/top-p is logit descending,
ties to the smaller id; top-p keeps the shortest prefix of that ranking whose mass (after
top-k, renormalized) reaches top_p; a draw with uniform u from weights w is the smallest id k
with u * sum(w) < w[0] + ... + w[k].
"""

from __future__ import annotations

import hashlib
import hmac
import math
import struct
from collections.abc import Callable, Sequence
from typing import Any

# -- deterministic CBOR (RFC 8949 §4.2.1), for the contract digest and the verdict --------------


def _head(major: int, value: int) -> bytes:
    if value < 24:
        return bytes([major << 5 | value])
    for extra, fmt in ((24, ">B"), (25, ">H"), (26, ">I"), (27, ">Q")):
        if value < 1 << (8 * struct.calcsize(fmt)):
            return bytes([major << 5 | extra]) + struct.pack(fmt, value)
    raise ValueError("integer too large")


def cbor(value: Any) -> bytes:
    """Core deterministic encoding: shortest heads, definite lengths, map keys ordered by the
    bytes of their encodings."""
    if isinstance(value, bool):
        return b"\xf5" if value else b"\xf4"
    if value is None:
        return b"\xf6"
    if isinstance(value, int):
        return _head(0, value) if value >= 0 else _head(1, -1 - value)
    if isinstance(value, bytes):
        return _head(2, len(value)) + value
    if isinstance(value, str):
        raw = value.encode()
        return _head(3, len(raw)) + raw
    if isinstance(value, (list, tuple)):
        return _head(4, len(value)) + b"".join(cbor(v) for v in value)
    if isinstance(value, dict):
        items = sorted((cbor(k), cbor(v)) for k, v in value.items())
        return _head(5, len(items)) + b"".join(k + v for k, v in items)
    raise TypeError(type(value))


# -- §4.1 contract, §4.2 digests ---------------------------------------------------------------

# Contract members typed hash32 / bstr in §4.1 (the vector files write bytes as hex).
_BYTES = {"target", "tokenizer", "scope"}


def contract_from_json(obj: dict[str, Any]) -> dict[str, Any]:
    out = dict(obj)
    for key in _BYTES & out.keys():
        out[key] = bytes.fromhex(out[key])
    if "drafters" in out:
        out["drafters"] = [bytes.fromhex(h) for h in out["drafters"]]
    return out


def contract_digest(contract: dict[str, Any]) -> bytes:
    return hashlib.sha256(b"SDCP-CONTRACT-1\x00" + cbor(contract)).digest()


def _u32(x: int) -> bytes:
    return struct.pack(">I", x)


def prefix_digest(digest_of_contract: bytes, prompt: Sequence[int]) -> bytes:
    """d[0]."""
    return hashlib.sha256(b"SDCP-PREFIX-1\x00" + digest_of_contract + _u32(len(prompt))
                          + b"".join(_u32(t) for t in prompt)).digest()


def extend(digest: bytes, tokens: Sequence[int]) -> bytes:
    """d[k] = SHA-256(d[k-1] || uint32(o[k])), once per committed token."""
    for t in tokens:
        digest = hashlib.sha256(digest + _u32(t)).digest()
    return digest


# -- §6.4 randoms, §4.1 profile, rules 1 and 2 ---------------------------------------------------


def uniform(seed: int, session: bytes, round_no: int, i: int, purpose: int) -> float:
    mac = hmac.new(struct.pack(">Q", seed), b"SDCP-VERIFY-1\x00" + session + _u32(round_no) + _u32(i)
                   + bytes([purpose]), hashlib.sha256).digest()
    return (int.from_bytes(mac[:8], "big") >> 11) / float(1 << 53)


def profile(logits: Sequence[float], sampling: dict[str, int]) -> list[float]:
    """p after temperature, top-k and top-p, in that order (§4.1)."""
    order = sorted(range(len(logits)), key=lambda j: (-logits[j], j))
    temp = sampling.get("temperature_milli", 1000)
    if temp == 0:
        return [1.0 if j == order[0] else 0.0 for j in range(len(logits))]
    top = max(logits)
    w = [math.exp((x - top) / (temp / 1000.0)) for x in logits]
    kept = order
    k = sampling.get("top_k", 0)
    if 0 < k < len(logits):
        kept = kept[:k]
    top_p = sampling.get("top_p_milli", 0)
    if 0 < top_p < 1000:
        total, mass, cut = math.fsum(w[j] for j in kept), 0.0, []
        for j in kept:
            cut.append(j)
            mass += w[j]
            if mass >= top_p / 1000.0 * total:
                break
        kept = cut
    total = math.fsum(w[j] for j in kept)
    keep = set(kept)
    return [w[j] / total if j in keep else 0.0 for j in range(len(logits))]


def draw(weights: Sequence[float], u: float) -> int:
    total, acc = math.fsum(weights), 0.0
    for j, w in enumerate(weights):
        acc += w
        if u * total < acc:
            return j
    return max(j for j, w in enumerate(weights) if w > 0)


def rule1(logits: Sequence[Sequence[float]], proposed: Sequence[int]) -> tuple[int, int]:
    """(accepted, additional token): greedy, ties to the smallest id."""
    def argmax(row: Sequence[float]) -> int:
        return min(range(len(row)), key=lambda j: (-row[j], j))
    a = 0
    while a < len(proposed) and proposed[a] == argmax(logits[a]):
        a += 1
    return a, argmax(logits[a])


def exact_residual(a: float, b: float) -> float:
    return max(0.0, a - b)


def rule2(p: Sequence[Sequence[float]], q: Sequence[Sequence[float]], proposed: Sequence[int],
          u: Sequence[Sequence[float]], residual_of: Callable[[float, float], float] = exact_residual,
          ) -> tuple[int, int]:
    """(accepted, additional token); u[i-1] = (acceptance uniform, drawing uniform) of position i.
    ``residual_of`` is there for the tests that check the vectors catch a wrong residual."""
    for i, x in enumerate(proposed):
        if not u[i][0] < min(1.0, p[i][x] / q[i][x]):
            residual = [residual_of(a, b) for a, b in zip(p[i], q[i], strict=True)]
            return i, draw(residual if math.fsum(residual) > 0 else p[i], u[i][1])
    m = len(proposed)
    return m, draw(p[m], u[m][1])


def emitted(proposed: Sequence[int], accepted: int, extra: int, stop: Sequence[int], max_new: int,
            committed: int) -> list[int]:
    """§6.3: the accepted tokens and the additional one, cut after the first stop token and
    at max_new output tokens in all."""
    out = list(proposed[:accepted]) + [extra]
    for k, t in enumerate(out):
        if t in stop:
            out = out[: k + 1]
            break
    return out[: max(0, max_new - committed)]
