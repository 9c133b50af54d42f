"""Pure-Python reference of the sampling profile (§4.1) and the acceptance rules (§6.4).

This is the definition the kernels are checked against (through the round vectors) and
what the in-process demo and the tests use. It works on plain float lists, in double
precision, and reads random values only through the ``uniform(i, purpose)`` callable it
is given, so a seeded round is reproducible bit for bit.

Position numbering: proposed positions are ``i = 1..M`` and the position after the
proposal is ``M + 1``, as in §6.3's ``p[1..M+1]``; ``p_rows[i - 1]`` is ``p[i]``. The same
``i`` enters the HMAC of §6.4 (see docs/interpretations.md).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sdcp_fast.protocol.messages import Sampling
from sdcp_fast.protocol.problems import BadProposal
from sdcp_fast.protocol.randoms import PURPOSE_ACCEPT, PURPOSE_DRAW

Uniform = Callable[[int, int], float]
"""``uniform(i, purpose) -> r`` in [0, 1), for position ``i`` (1-based) and purpose 0 or 1."""


def argmax(row: Sequence[float]) -> int:
    """Index of the largest value, ties broken in favour of the smallest index (§4.1, §6.4)."""
    best = 0
    for k in range(1, len(row)):
        if row[k] > row[best]:
            best = k
    return best


def _normalized(weights: Sequence[float]) -> list[float]:
    total = math.fsum(weights)
    return [w / total for w in weights]


def _softmax(logits: Sequence[float], temperature: float) -> list[float]:
    scaled = [x / temperature for x in logits]
    top = max(scaled)
    return _normalized([math.exp(x - top) for x in scaled])


def _ranked(logits: Sequence[float]) -> list[int]:
    # Order by (probability desc, id asc). Softmax is monotone, so ranking the logits gives
    # that order exactly, where probabilities rounded to equal values would invent ties.
    return sorted(range(len(logits)), key=lambda k: (-logits[k], k))


def _keep(p: Sequence[float], kept: Sequence[int]) -> list[float]:
    chosen = set(kept)
    return _normalized([p[k] if k in chosen else 0.0 for k in range(len(p))])


def profile_distribution(logits: Sequence[float], sampling: Sampling | None) -> list[float]:
    """The target distribution p of §4.1: temperature, then top-k, then top-p, renormalized.

    Absent members leave the distribution unchanged (temperature 1, no top-k, top-p 1);
    0 also switches top-k and top-p off, as in the kernels. Temperature 0 is one-hot on the
    argmax. Top-p keeps the shortest prefix of the (prob desc, id asc) order whose mass
    reaches top_p, so at least one token.
    """
    if not logits:
        raise ValueError("empty logits row")
    s = sampling or Sampling()
    if s.temperature_milli == 0:
        one_hot = [0.0] * len(logits)
        one_hot[argmax(logits)] = 1.0
        return one_hot
    temperature = 1.0 if s.temperature_milli is None else s.temperature_milli / 1000.0
    p = _softmax(logits, temperature)
    order = _ranked(logits)
    if s.top_k:
        order = order[: s.top_k]
        p = _keep(p, order)
    if s.top_p_milli and s.top_p_milli < 1000:
        top_p = s.top_p_milli / 1000.0
        kept: list[int] = []
        mass = 0.0
        for k in order:
            kept.append(k)
            mass += p[k]
            if mass >= top_p:
                break
        p = _keep(p, kept)
    return p


def inverse_cdf(weights: Sequence[float], u: float) -> int:
    """Draw from unnormalized ``weights`` with ``u`` in [0, 1): the smallest id k with
    ``u * total < w[0] + ... + w[k]``, ids ascending. Rounding at the top end falls back
    to the largest id with positive weight."""
    total = math.fsum(weights)
    if not total > 0.0:
        raise ValueError("no probability mass to draw from")
    target = u * total
    acc = 0.0
    last = 0
    for k, w in enumerate(weights):
        if w > 0.0:
            acc += w
            last = k
            if target < acc:
                return k
    return last


@dataclass(frozen=True)
class RoundResult:
    """What a rule decided: ``accepted`` tokens of the proposal, then ``next_token``."""

    accepted: int
    next_token: int


def greedy(p_rows: Sequence[Sequence[float]], tokens: Sequence[int]) -> RoundResult:
    """Rule 1 (§6.4): accept while ``x[i] == argmax p[i]``; the extra token is argmax p[a+1].

    ``p_rows`` has M+1 rows (logits work too: argmax is the same under the profile).
    """
    if len(p_rows) != len(tokens) + 1:
        raise ValueError("need M + 1 rows for M tokens")
    accepted = 0
    for x, row in zip(tokens, p_rows, strict=False):
        if x != argmax(row):
            break
        accepted += 1
    return RoundResult(accepted, argmax(p_rows[accepted]))


_F32 = struct.Struct("<f")


def q_of_tokens(q_rows: bytes | bytearray | memoryview, tokens: Sequence[int], vocab: int) -> list[float]:
    """``q[i](x[i])`` for each proposed token, read from the raw ``q_rows`` object (§5.2:
    M rows of V little-endian binary32, in position order) without decoding whole rows."""
    m = len(tokens)
    if vocab < 1 or len(q_rows) != m * vocab * 4:
        raise BadProposal(f"q_rows holds {len(q_rows)} octets, expected {m} x {vocab} x 4")
    out: list[float] = []
    unpack = _F32.unpack_from
    for k, x in enumerate(tokens):
        if not 0 <= x < vocab:
            raise BadProposal(f"token {x} outside the vocabulary of {vocab}")
        out.append(unpack(q_rows, (k * vocab + x) * 4)[0])
    return out


def check_q(q_of_x: Sequence[float], m: int) -> None:
    """Rule 2's precondition (§6.3, §6.4): one value per proposed position, none zero.

    Raises :class:`BadProposal`; call it before any random value of the round is drawn.
    """
    if len(q_of_x) != m:
        raise BadProposal(f"{len(q_of_x)} draft probabilities for {m} proposed tokens")
    for i, q in enumerate(q_of_x, start=1):
        # NaN and negative values are as unusable as zero.
        if not (q > 0.0 and math.isfinite(q)):
            raise BadProposal(f"q[{i}](x[{i}]) = {q!r}; the proposed token cannot have been sampled")


def speculative(
    p_rows: Sequence[Sequence[float]],
    q_rows: Sequence[Sequence[float]],
    tokens: Sequence[int],
    uniform: Uniform,
) -> RoundResult:
    """Rule 2 (§6.4): accept x[i] iff ``r < min(1, p[i](x[i]) / q[i](x[i]))`` with
    ``r = uniform(i, 0)``. At the first rejection, the extra token is drawn from
    normalized ``max(0, p[i] - q[i])`` with ``uniform(i, 1)``; after full acceptance,
    from ``p[M+1]`` with ``uniform(M + 1, 1)``. Both draws use :func:`inverse_cdf`.

    ``q[i](x[i]) > 0`` is checked for every i before the first random value is read.
    """
    m = len(tokens)
    if len(p_rows) != m + 1 or len(q_rows) != m:
        raise ValueError("need M + 1 p rows and M q rows for M tokens")
    check_q([row[x] for row, x in zip(q_rows, tokens, strict=True)], m)
    for i in range(1, m + 1):
        x = tokens[i - 1]
        p, q = p_rows[i - 1], q_rows[i - 1]
        r = uniform(i, PURPOSE_ACCEPT)
        if r < min(1.0, p[x] / q[x]):
            continue
        residual = [max(0.0, pk - qk) for pk, qk in zip(p, q, strict=True)]
        if not math.fsum(residual) > 0.0:
            # Only reachable through rounding (p == q rejects with probability 0): draw from p.
            residual = list(p)
        return RoundResult(i - 1, inverse_cdf(residual, uniform(i, PURPOSE_DRAW)))
    return RoundResult(m, inverse_cdf(p_rows[m], uniform(m + 1, PURPOSE_DRAW)))
