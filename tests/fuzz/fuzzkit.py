"""Hostile input for every endpoint: what to send and what every answer must satisfy.

Inputs come in three layers, each drawn from a seeded ``random.Random`` so that a failure
repeats from its seed:

- **generated**: a message of the endpoint's CDDL rule from tests/protocol/message_strategies.py
  (hypothesis), often *anchored* to a live session (its id, epoch, round, base and digest), so
  that it reaches the checks behind decoding instead of stopping at ``sdcp-unknown-session``;
- **reshaped**: that message's CBOR map with members dropped, replaced by values of any CBOR
  type (floats, tags, negative and oversized integers, deep nesting) or joined by unknown keys;
- **mutated**: the encoded bytes flipped, truncated, spliced, with lengths made huge.

Every answer is checked by :func:`check_answer`: no 5xx but the documented ones, no traceback,
an RFC 9457 body whose type is a known one with its registered status, and, where the body
does not decode, exactly the problem the message decoder itself raises.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Iterable
from typing import Any

import cbor2

from sdcp_fast.cache import failures as mlc_errors
from sdcp_fast.protocol import cbor
from sdcp_fast.protocol.problems import BY_SUFFIX, PROBLEM_MEDIA_TYPE, SdcpProblem, type_suffix
from sdcp_fast.roles.wire import InternalError, MethodNotAllowed, NotFound
from sdcp_fast.transport.base import Response

# Inputs per endpoint: SDCP_FUZZ_INPUTS (10^4 in CI; ``make fuzz`` sets more). Each message
# hypothesis generates gives PER_EXAMPLE bodies (itself, reshaped maps, mutated bytes).
INPUTS = int(os.environ.get("SDCP_FUZZ_INPUTS", "10000"))
PER_EXAMPLE = 50
EXAMPLES = max(1, INPUTS // PER_EXAMPLE)

# Every problem type a role may answer, with its status: Table 2, ours (sdcp-bad-request,
# sdcp-forbidden, ...) and the route table's.
STATUS_OF: dict[str, int] = {suffix: cls.status for suffix, cls in BY_SUFFIX.items()}
STATUS_OF.update({cls.suffix: cls.status for cls in (NotFound, MethodNotAllowed, InternalError)})
STATUS_OF.update({cls.suffix: cls.status for cls in vars(mlc_errors).values()  # the MLC's, passed on
                  if isinstance(cls, type) and issubclass(cls, SdcpProblem) and cls.suffix.startswith("mlc-")})

TRACEBACK_MARKS = (b"Traceback (most recent call last)", b'File "/', b"site-packages", b".py\", line")

# Values of every CBOR major type and the edges of each, for reshaping maps.
ODD_VALUES: list[Any] = [
    0, 1, 23, 24, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**63, 2**64 - 1, -1, -(2**64),
    "", "x", "\u0000", "\ud7ff" * 3, "mlc://" + "a" * 300, "https://evil/../../etc/passwd",
    b"", b"\x00" * 16, b"\xff" * 32, b"\x00" * 33, True, False, None, [], [0], [2**32] * 3, {}, {"a": 1},
    1.5, float("nan"), float("inf"), -0.0, cbor2.CBORTag(1, 0), cbor2.CBORTag(2, b"\x01"), cbor2.undefined,
    [[[[[[[[]]]]]]]], {"nested": {"deeper": [1, {"x": [2]}]}}, list(range(70)),
]


def encode_any(value: Any) -> bytes:
    """CBOR of any value, floats and tags included (the project's encoder refuses those)."""
    return cbor2.dumps(value)


def reshape(message: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    """The map with one to three members dropped, replaced or added (recursing into nested maps)."""
    out = dict(message)
    for _ in range(rng.randint(1, 3)):
        op = rng.randrange(5)
        keys = list(out)
        if op == 0 and keys:
            del out[rng.choice(keys)]
        elif op in (1, 2) and keys:
            out[rng.choice(keys)] = rng.choice(ODD_VALUES)
        elif op == 3:
            out[rng.choice(["unknown", "x-extension", 7, b"k", ""])] = rng.choice(ODD_VALUES)
        else:
            nested = [k for k in keys if isinstance(out[k], dict)]
            if nested:
                key = rng.choice(nested)
                out[key] = reshape(out[key], rng)
    return out


_HEADS = [b"\x1b\xff\xff\xff\xff\xff\xff\xff\xff", b"\x5b\x7f\xff\xff\xff\xff\xff\xff\xff",
          b"\x9b\x00\x00\x00\x01\x00\x00\x00\x00", b"\xbf", b"\x9f", b"\xff", b"\xf7", b"\xf9\x7e\x00",
          b"\xc6", b"\x7f\x61", b"\xa1\x00"]


def mutate(data: bytes, rng: random.Random) -> bytes:
    """``data`` with one to four byte-level mutations."""
    buf = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(9)
        n = len(buf)
        if op == 0 and n:
            buf[rng.randrange(n)] ^= 1 << rng.randrange(8)
        elif op == 1 and n:
            buf[rng.randrange(n)] = rng.choice([0x00, 0x17, 0x18, 0x1f, 0x3f, 0x5f, 0x7f, 0x9f, 0xbf, 0xff, 0xf6])
        elif op == 2:
            at = rng.randrange(n + 1)
            buf[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
        elif op == 3 and n:
            at = rng.randrange(n)
            del buf[at:at + rng.randint(1, 8)]
        elif op == 4 and n:
            del buf[rng.randrange(n):]  # truncated
        elif op == 5 and n:
            at, size = rng.randrange(n), rng.randint(1, 16)
            buf[at:at] = buf[at:at + size]  # a slice repeated
        elif op == 6:
            at = rng.randrange(n + 1)
            buf[at:at] = rng.choice(_HEADS)  # a huge or indefinite length, a stray break
        elif op == 7:
            depth = rng.choice([33, 200, 5000])
            buf[:] = rng.choice([b"\x81", b"\xa1\x00", b"\x9f"]) * depth + buf
        else:
            buf += bytes(rng.randrange(256) for _ in range(rng.randint(1, 32)))
    return bytes(buf)


def variants(base: Any, rng: random.Random, n: int) -> Iterable[bytes]:
    """``n`` bodies derived from one message: itself, reshaped maps, and mutated bytes."""
    encoded = base.encode()
    yield encoded
    as_map = base.to_map()
    for i in range(n - 1):
        kind = i % 3
        if kind == 0:
            try:
                yield encode_any(reshape(as_map, rng))
            except (ValueError, TypeError, cbor2.CBOREncodeError):
                yield mutate(encoded, rng)
        else:
            yield mutate(encoded, rng)


def decoder_problem(cls: type[Any], body: bytes) -> SdcpProblem | None:
    """The problem ``cls.decode`` raises for ``body`` (None: it decodes)."""
    try:
        cls.decode(body)
    except SdcpProblem as problem:
        return problem
    return None


def check_answer(response: Response, *, allowed: Iterable[str] | None = None,
                 expect: str | Iterable[str] | None = None,
                 server_errors: Iterable[str] = (), context: object = None) -> None:
    """What every answer must satisfy (module doc). ``allowed``: the problem types this
    endpoint may answer; ``expect``: the one it must; ``server_errors``: 5xx types documented
    for it (none by default); ``context`` (the request) is shown when a check fails."""
    where = context
    assert response.status < 500 or _suffix(response) in set(server_errors), \
        f"{response.status} {response.body[:300]!r} {where}"
    for mark in TRACEBACK_MARKS:
        assert mark not in response.body, f"traceback in the answer: {response.body[:500]!r} {where}"
    if response.status < 400:
        return
    assert response.content_type.startswith(PROBLEM_MEDIA_TYPE), f"{response.content_type} {where}"
    body = json.loads(response.body)
    suffix = type_suffix(body["type"])
    assert suffix in STATUS_OF, f"unknown problem type {body['type']} {where}"
    assert response.status == STATUS_OF[suffix] == body["status"], f"{response.status} for {suffix} {where}"
    assert isinstance(body.get("title"), str) and body["title"], where
    if allowed is not None:
        assert suffix in set(allowed), f"{suffix} is not an answer of this endpoint {where}"
    if expect is not None:
        assert suffix in ({expect} if isinstance(expect, str) else set(expect)), f"answered {suffix} ({body.get('detail')}), expected {expect} {where}"


def _suffix(response: Response) -> str | None:
    try:
        return type_suffix(json.loads(response.body)["type"])
    except (ValueError, KeyError, TypeError):
        return None


def is_cbor(body: bytes) -> bool:
    try:
        cbor.decode(body)
    except SdcpProblem:
        return False
    return True
