"""The verifier's random values (draft §6.4).

With a seed in the sampling profile each value is derived, so a seeded session is replayable
bit for bit by any implementation:

    HMAC-SHA-256(key = uint64(seed),
                 "SDCP-VERIFY-1" || 0x00 || session || uint32(round) || uint32(i) || uint8(purpose))

and the first 53 bits of the MAC, divided by 2**53, give a uniform value in [0, 1). Positions i
count from 1, as p[1..M+1] does in §6.3/§6.4 (docs/interpretations.md). Without a seed the
values come from the operating system's CSPRNG (:func:`os.urandom`), drawn for many values at a
time: a system call per value took half the CPU of a round's values (10 values: 5.6 us from 10.5).
A round's values are drawn together (:meth:`VerifierRandom.round_values`): one slice of the pool
for all of them took about a third of the CPU of one call per value (10 values: 1.9 us from 5.2).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import struct

from sdcp_fast.protocol.problems import BadRequest

VERIFY_DOMAIN = b"SDCP-VERIFY-1\x00"
PURPOSE_ACCEPT = 0  # the acceptance test r < min(1, p/q)
PURPOSE_DRAW = 1  # drawing the additional token (residual or p[M+1])
_SCALE = 1.0 / (1 << 53)
_TAIL = struct.Struct(">IIB")
_POOL_VALUES = 64  # CSPRNG values drawn per system call by an unseeded session


class VerifierRandom:
    """The uniform values of one session: seeded (§6.4 derivation) or, with ``seed=None``, CSPRNG.

    Keying the HMAC once per session and copying it per value keeps derivation cheap.
    """

    __slots__ = ("_keyed", "_prefix", "_pool", "_at")

    def __init__(self, seed: int | None, session: bytes) -> None:
        if not isinstance(session, bytes) or len(session) != 16:
            raise BadRequest("session id must be 16 bytes")
        self._prefix = VERIFY_DOMAIN + session
        self._keyed: hmac.HMAC | None = None
        self._pool, self._at = b"", 0  # unseeded: CSPRNG bytes not yet used, each used once
        if seed is not None:
            if type(seed) is not int or not 0 <= seed < (1 << 64):
                raise BadRequest("seed must be a uint64")
            self._keyed = hmac.new(seed.to_bytes(8, "big"), self._prefix, hashlib.sha256)

    @property
    def seeded(self) -> bool:
        return self._keyed is not None

    def uniform(self, round: int, i: int, purpose: int) -> float:
        """r in [0, 1) for position ``i`` (from 1) of ``round`` and ``purpose`` (0 accept, 1 extra)."""
        try:
            tail = _TAIL.pack(round, i, purpose)
        except struct.error as exc:
            raise BadRequest("round and i must fit in uint32, purpose in uint8") from exc
        if self._keyed is None:
            pool, at = self._fresh(1)
            return (int.from_bytes(pool[at : at + 8], "big") >> 11) * _SCALE
        mac = self._keyed.copy()
        mac.update(tail)
        return (int.from_bytes(mac.digest()[:8], "big") >> 11) * _SCALE

    def round_values(self, round: int, count: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """The values of positions 1..``count`` of ``round``: purpose 0's, then purpose 1's
        (``uniform(round, i, p)`` each; unseeded, ``2 * count`` fresh CSPRNG values)."""
        if self._keyed is not None:
            positions = range(1, count + 1)
            return (tuple(self.uniform(round, i, PURPOSE_ACCEPT) for i in positions),
                    tuple(self.uniform(round, i, PURPOSE_DRAW) for i in positions))
        if not 0 <= round <= 0xFFFFFFFF:
            raise BadRequest("round and i must fit in uint32, purpose in uint8")
        pool, at = self._fresh(2 * count)
        values = [(v >> 11) * _SCALE for v in struct.unpack_from(f">{2 * count}Q", pool, at)]
        return tuple(values[:count]), tuple(values[count:])

    def _fresh(self, n: int) -> tuple[bytes, int]:
        """``n`` CSPRNG values never handed out before: the pool and the offset of their 8n
        bytes (the pool drawn again, large enough, when fewer are left)."""
        at = self._at
        if at + 8 * n > len(self._pool):
            self._pool, at = os.urandom(8 * max(n, _POOL_VALUES)), 0
        self._at = at + 8 * n
        return self._pool, at


def verifier_uniform(seed: int, session: bytes, round: int, i: int, purpose: int) -> float:
    """One seeded value of §6.4; see :class:`VerifierRandom` for many values of a session."""
    return VerifierRandom(seed, session).uniform(round, i, purpose)


def secure_uniform() -> float:
    """A CSPRNG value in [0, 1) with 53 random bits, for sessions without a seed."""
    return secrets.randbits(53) * _SCALE
