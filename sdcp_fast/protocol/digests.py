"""The committed-prefix digest chain (draft §4.2).

    d[0] = SHA-256("SDCP-PREFIX-1" || 0x00 || contract_digest || uint32(P) || uint32(t[0..P-1]))
    d[k] = SHA-256(d[k-1] || uint32(o[k]))

uint32 is four octets, network byte order. A token or prompt length that does not fit is a
:class:`BadRequest`: such a prefix has no digest, so no party can agree on it.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable, Sequence

from sdcp_fast.protocol.problems import BadRequest

PREFIX_DOMAIN = b"SDCP-PREFIX-1\x00"
UINT32_MAX = 0xFFFFFFFF
_U32 = struct.Struct(">I")


def uint32_be(values: Sequence[int]) -> bytes:
    """``values`` as concatenated 4-octet big-endian integers (the draft's uint32())."""
    # struct takes bools and anything with __index__; a token is a Python int and nothing else.
    if not all(type(v) is int for v in values):
        raise BadRequest("a token is not an integer")
    try:
        return struct.pack(f">{len(values)}I", *values)
    except struct.error as exc:
        raise BadRequest("a token does not fit in uint32") from exc


def _check_digest(name: str, value: bytes) -> None:
    if not isinstance(value, bytes) or len(value) != 32:
        raise BadRequest(f"{name} must be 32 bytes")


def prefix_digest(contract_digest: bytes, prompt: Sequence[int]) -> bytes:
    """d[0] for ``prompt`` (the P prompt tokens) under the contract with ``contract_digest``."""
    _check_digest("contract digest", contract_digest)
    if len(prompt) > UINT32_MAX:
        raise BadRequest("prompt length does not fit in uint32")
    h = hashlib.sha256(PREFIX_DOMAIN)
    h.update(contract_digest)
    h.update(_U32.pack(len(prompt)))
    h.update(uint32_be(prompt))
    return h.digest()


def extend_digest(digest: bytes, tokens: Iterable[int]) -> bytes:
    """d[n + k] from d[n] and the k tokens committed after it (k may be 0)."""
    _check_digest("digest", digest)
    # Both sides of every round run this (the verifier's commit, the drafter's check of the
    # verdict): each token is checked as it is hashed, as uint32_be checks a whole list.
    sha256, pack = hashlib.sha256, _U32.pack
    for token in tokens:
        if type(token) is not int:
            raise BadRequest("a token is not an integer")
        try:
            word = pack(token)
        except struct.error as exc:
            raise BadRequest("a token does not fit in uint32") from exc
        digest = sha256(digest + word).digest()
    return digest
