"""A drafter's q rows in the MLC (§5.2, §6.2): the object that holds them, its name under
the drafter's own tag, the put under a lease that rides out an MLC restart, and the lease's
release once the round is answered (through the node's shared memory: the session's slot,
rewritten each round and released when the session ends)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch

from sdcp_fast.cache import object_uri
from sdcp_fast.cache.uri import writer_tag
from sdcp_fast.protocol.drafting import DrafterSession
from sdcp_fast.roles.objects import Objects
from sdcp_fast.roles.retry import retrying
from sdcp_fast.store.nodes import located
from sdcp_fast.store.shm_client import ShmClient

LEASE_TTL = 30.0  # seconds a q-rows object is held for the verifier; released at the verdict


def q_row_object(rows: torch.Tensor) -> Any:
    """What is put as the q_rows object: the rows' binary32 octets and nothing else (§5.2).

    Rows in host memory go as a flat byte view of the tensor (no copy): a remote MLC then gets
    them as a raw body, not wrapped in a CBOR map with their layout (built, copied and parsed
    again on both sides); the verifier knows the layout (M x V) already. Rows on a GPU stay a
    tensor, so that a store in the same process can keep them there."""
    rows = rows.detach().to(torch.float32).contiguous()
    if rows.device.type != "cpu":
        return rows
    # Through numpy's buffer: a few microseconds less a round than as_bytes_view's reshapes.
    return rows.numpy().data.cast("B").toreadonly()


class QRows:
    """Where one drafter puts the rows of its proposals, and lets go of them."""

    def __init__(self, objects: Objects, uri: str, *, attempts: int, first_delay: float,
                 on_retry: Callable[[], None]) -> None:
        self.objects = objects
        # Names our rows: only we can create them, so the rows a dead predecessor left under a
        # round are its own and never refuse ours.
        self.tag = writer_tag(uri)
        self._attempts = attempts
        self._first_delay = first_delay
        self._on_retry = on_retry

    async def put(self, record: DrafterSession, rows: torch.Tensor) -> tuple[str, str | None]:
        """Put the rows of ``record``'s next round; their name and our lease on them, which
        holds them for the verifier until the verdict (§6.2)."""
        # Named at our host's node where the cluster has several: the verifier reads them there.
        uri = located(self.objects.store, object_uri(record.assignment.contract.scope or bytes(16), record.session,
                                                     "q_rows", record.round + 1, tag=self.tag))
        # An MLC restart is ridden out with the proposals' backoff: a session whose rows cannot
        # be stored has no proposal to send, and giving up would leave it with a drafter that
        # never proposes again.
        data = q_row_object(rows)
        if isinstance(shm := getattr(self.objects.store, "shm", None), ShmClient):
            # Through the node's shared memory, a session's rows go into one slot, leased at its
            # first round and rewritten in place after: no lease (None) and no request a round.
            shm.rolling = True
            shm.keep = True  # where it cannot (its slot's name held): each round into kept pages
        lease = await retrying(lambda _: self.objects.put(uri, data, LEASE_TTL),
                               attempts=self._attempts, first_delay=self._first_delay,
                               on_retry=lambda *_: self._on_retry())
        return uri, lease

    def end(self, record: DrafterSession) -> None:
        """The session is over here: the slot its rows were rewritten in, if any, let go of
        (released within 50 ms)."""
        shm = getattr(self.objects.store, "shm", None)
        if isinstance(shm, ShmClient):
            shm.end_rows(object_uri(record.assignment.contract.scope or bytes(16), record.session, "q_rows", 1,
                                    tag=self.tag))

    async def release(self, lease: str) -> None:
        """The round's rows are spent once it is answered (§6.2): deleted, not left to fill the
        MLC's host tier and be demoted to disk to make room. Through the node's shared memory
        the release rides on our next put there (within 50 ms): a request less a round."""
        shm = getattr(self.objects.store, "shm", None)
        if isinstance(shm, ShmClient) and shm.release_later(lease):
            return
        with contextlib.suppress(Exception):
            await self.objects.release(lease, drop=True)
