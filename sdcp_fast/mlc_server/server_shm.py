"""The MLC server's part of same-host objects in shared memory (:mod:`sdcp_fast.cache.tiers.shm`):
where clients find the node's folder, a put whose bytes are an upload in it, and a get
answered with the slot's name instead of its bytes.

  GET /shm                              CBOR {folder, token, adopted}; 404 when the node keeps none
  PUT /objects/<name>?shm=<token>       empty body: the object is the upload ``up-<token>``
      [&release=<lease>,<lease>...]     and, once it is stored, these leases of the caller's
                                        released with drop (as ``DELETE /leases/<id>?drop=1``)
  GET /objects/<name>, MLC-Shm: 1       200, empty body, MLC-Shm-Slot and MLC-Shm-Serial when
                                        the object is a slot; its bytes as usual otherwise
  GET /objects/<round's q rows>         when no such object is stored: the round as its writer
                                        keeps it in its session's slot (rewritten in place
                                        round after round), copied, for a reader on another host

Everything else about these calls (authorization, leases, accounting) is the ordinary route's.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections.abc import Iterator

from sdcp_fast.cache import policy
from sdcp_fast.cache.failures import ObjectUnavailable
from sdcp_fast.cache.index import MLC, Head, ObjectCheck
from sdcp_fast.cache.tiers.shm import ASK, SERIAL, SLOT, ShmTier, ShmUpload, name_digest, rows_round
from sdcp_fast.protocol.peer import Peer
from sdcp_fast.protocol.problems import BadRequest, SdcpProblem

__all__ = ["ASK", "release_spent", "round_in_slot", "shm_tier", "slot_headers", "spent_leases", "upload"]

MAX_SPENT = 64  # leases one put may release
_SPENT = re.compile(rf"[0-9a-f]{{32}}(?:,[0-9a-f]{{32}}){{0,{MAX_SPENT - 1}}}")


def shm_tier(mlc: MLC) -> ShmTier | None:
    return next((t for t in mlc.tiers if isinstance(t, ShmTier)), None)


@contextlib.contextmanager
def upload(tier: ShmTier | None, token: str, body_size: int, ttl: float | None = None) -> Iterator[ShmUpload]:
    """The upload ``token`` names, mapped for the put under a birth lease of ``ttl`` seconds;
    removed afterwards unless a slot took it (the put failed, or another tier copied it)."""
    if tier is None:
        raise BadRequest("this MLC keeps no objects in shared memory")
    if body_size:
        raise BadRequest("a put from shared memory has an empty body")
    # Taken before the put's own clock reading: a reader that finds the slot by name stops
    # trusting it no later than the index lets the lease expire.
    deadline = 0 if ttl is None else time.monotonic_ns() + int(ttl * 1e9)
    up = ShmUpload.open(tier.folder, token)
    up.deadline = deadline
    try:
        yield up
    finally:
        if not up.serial:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(up.path)
            with contextlib.suppress(BufferError):
                up.close()


def spent_leases(spec: str | None) -> list[str]:
    """The lease ids of a put's ``release`` query (checked before the put is made)."""
    if spec is None:
        return []
    if not _SPENT.fullmatch(spec):
        raise BadRequest(f"release is at most {MAX_SPENT} lease ids, comma-separated")
    return spec.split(",")


def release_spent(mlc: MLC, peer: Peer | None, leases: list[str]) -> None:
    """``leases`` released with drop, as ``DELETE /leases/<id>?drop=1`` each would be; one
    that is unknown (expired) or another holder's is left as it is: the put stands either way,
    and an expired lease has freed its object already."""
    check = policy.may_hold(peer)
    for lease in leases:
        with contextlib.suppress(SdcpProblem):
            mlc.release(lease, drop=True, check=check)


def round_in_slot(mlc: MLC, tier: ShmTier | None, uri: str, check: ObjectCheck | None) -> tuple[Head, bytes] | None:
    """The q rows of the round ``uri`` names, if a same-host writer keeps them in its session's
    slot (``rows_round``) and it holds that round, whole: a copy, checked after it was taken;
    None otherwise (the object is missing). Read under the reader's ``check`` of that name."""
    found = rows_round(uri)
    if tier is None or found is None:
        return None
    try:
        head, view = mlc.read(found[0], check=check)
    except ObjectUnavailable:
        return None
    if head.tier != tier.name or (rows := tier.round_of(view, name_digest(uri))) is None:
        return None
    return head, rows


def slot_headers(tier: ShmTier | None, head: Head, view: memoryview) -> dict[str, str] | None:
    """What a same-host reader is told instead of the bytes of ``view``, if it is a slot."""
    if tier is None or head.tier != tier.name:
        return None
    slot = tier.slot_of(view)
    if slot is None:
        return None
    return {SLOT: slot[0], SERIAL: str(slot[1]), "mlc-size": str(head.size)}
