"""The router's routing records in the MLC (docs/interpretations.md, "Routing records"): one
object per session, ``mlc://<scope>/<session>/routing``, rewritten whenever the session's
routing changes (open, assignment, sampling update, fail-over, end), and one index per router,
``mlc://<scope>/<index id>/routing``, naming the sessions it routes. A restarted router reads
its index and adopts the live sessions still given to it; any router sharing the scope adopts
a session a client asks it to resume. The format and the adoption decision are
protocol/routing_records.py's; this module reads and writes them.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Protocol

from sdcp_fast.cache import object_uri
from sdcp_fast.cache.failures import ObjectUnavailable
from sdcp_fast.protocol.routing import RoutedSession
from sdcp_fast.protocol.routing_records import (
    decode_index,
    decode_record,
    encode_index,
    encode_record,
    index_id,
)

log = logging.getLogger("sdcp_fast.router")


class RecordObjects(Protocol):
    """Where the records are kept: the MLC's store, or etcd in a cluster
    (sdcp_fast/cluster/etcd_records.py). A missing one is ObjectUnavailable."""

    async def put(self, uri: str, data: Any, lease_ttl: float | None = None) -> str | None: ...

    async def get(self, uri: str) -> memoryview: ...


class RecordStore:
    """Reads and writes one router's routing records and its index, one write at a time."""

    def __init__(self, store: RecordObjects, scope: bytes, router: str) -> None:
        self.store, self.scope, self.router = store, scope, router
        self.index: set[bytes] = set()
        self._lock = asyncio.Lock()

    def name(self, session: bytes) -> str:
        return object_uri(self.scope, session, "routing")

    def index_name(self) -> str:
        return object_uri(self.scope, index_id(self.router), "routing")

    async def write(self, routed: RoutedSession) -> None:
        """Store the session's routing record as it stands when the write comes (its encoding)
        and keep the index in step (a finished session leaves it). A failure is logged: the
        session goes on, only its adoption would miss the change."""
        async with self._lock:
            try:
                data, done = encode_record(routed), routed.done  # one state, whatever changes meanwhile
                await self.store.put(self.name(routed.session), data)
                listed = routed.session in self.index
                if done and listed:
                    self.index.discard(routed.session)
                elif not done and not listed:
                    self.index.add(routed.session)
                else:
                    return
                await self.store.put(self.index_name(), encode_index(self.router, self.index))
            except Exception as exc:  # the MLC is away: routing goes on without the record
                log.warning("session %s: routing record not written: %s", routed.session.hex(), exc)

    async def forget(self, sessions: set[bytes]) -> None:
        """Take sessions another router routes now (or that ended) off the index."""
        async with self._lock:
            if not sessions & self.index:
                return
            self.index -= sessions
            try:
                await self.store.put(self.index_name(), encode_index(self.router, self.index))
            except Exception as exc:
                log.warning("routing index not written: %s", exc)

    async def read(self, session: bytes) -> RoutedSession | None:
        """The session as its record holds it; None when there is none or it is not one we can read
        (logged: a foreign or malformed object is never adopted)."""
        try:
            data = await self.store.get(self.name(session))
        except ObjectUnavailable:
            return None
        try:
            return decode_record(bytes(data))
        except ValueError as exc:
            log.warning("session %s: routing record ignored: %s", session.hex(), exc)
            return None

    async def listed(self) -> list[bytes]:
        """The sessions this router's index names (none: a first start, or an unreadable index)."""
        try:
            data = await self.store.get(self.index_name())
        except ObjectUnavailable:
            return []
        try:
            sessions = decode_index(bytes(data))
        except ValueError as exc:
            log.warning("routing index %s ignored: %s", self.index_name(), exc)
            return []
        self.index = set(sessions)
        return sessions
