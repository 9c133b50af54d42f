"""The router's view of the live instances (draft §6.6 status, §6.1) and its choice among them.

:class:`StatusTable` keeps each instance's last status until its ``ttl_ms`` runs out, by a
clock passed in. Drafter choice (a local policy, §6.1; docs/interpretations.md): among live
drafters whose model the contract permits, the lowest (load, queue, -accept_milli, instance),
so the least loaded wins and recent acceptance breaks ties. Verifier choice: among live
verifiers, the lowest (load, queue, instance).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from sdcp_fast.protocol.contract import permits_drafter
from sdcp_fast.protocol.messages import ROLE_DRAFTER, ROLE_VERIFIER, Contract, Status


@dataclass(frozen=True)
class _Entry:
    status: Status
    expires: float


class StatusTable:
    """Latest status of each instance, live until ``now`` passes its ttl_ms (§6.1)."""

    def __init__(self) -> None:
        self._entries: dict[str, _Entry] = {}
        self._models: dict[str, bytes] = {}
        self._gone: set[str] = set()  # dropped by expire() and not heard from since

    def register_model(self, instance: str, model: bytes) -> None:
        """The draft model (SHA-256 of its weights) an instance serves: operator configuration."""
        self._models[instance] = model

    def model_of(self, instance: str) -> bytes | None:
        return self._models.get(instance)

    def report(self, status: Status, now: float) -> None:
        """PUT instances/{id}/status."""
        self._entries[status.instance] = _Entry(status, now + status.ttl_ms / 1000.0)
        self._gone.discard(status.instance)

    def live(self, instance: str, now: float) -> bool:
        entry = self._entries.get(instance)
        return entry is not None and now < entry.expires

    def status(self, instance: str, now: float) -> Status | None:
        entry = self._entries.get(instance)
        return entry.status if entry is not None and now < entry.expires else None

    def live_drafters(self, now: float) -> list[Status]:
        return self.live_instances(ROLE_DRAFTER, now)

    def live_verifiers(self, now: float) -> list[Status]:
        return self.live_instances(ROLE_VERIFIER, now)

    def live_instances(self, role: int, now: float) -> list[Status]:
        return [e.status for e in self._entries.values() if e.status.role == role and now < e.expires]

    def expired(self, instance: str, now: float) -> bool:
        """Whether ``instance`` reported a status that has since expired (§6.9 failure
        detection). An instance never heard from has not expired: it is not live either."""
        entry = self._entries.get(instance)
        if entry is None:
            return instance in self._gone
        return now >= entry.expires

    def expire(self, now: float) -> list[str]:
        """Drop and return the instances whose status has expired; :meth:`expired` still
        answers True for them until they report again."""
        gone = [name for name, e in self._entries.items() if now >= e.expires]
        for name in gone:
            del self._entries[name]
        self._gone.update(gone)
        return gone

    def withdraw(self, instance: str) -> None:
        """Drop ``instance`` as if its status had expired (it left the deployment's membership
        registry): it is no candidate, and :meth:`expired` answers True until it reports again."""
        if self._entries.pop(instance, None) is not None:
            self._gone.add(instance)

    def ttl(self, instance: str) -> float | None:
        """Seconds of the ttl_ms ``instance`` last reported (also once expired), or None."""
        entry = self._entries.get(instance)
        return None if entry is None else entry.status.ttl_ms / 1000.0

    def next_expiry(self) -> float | None:
        """When the next entry expires (the adapter's timer), or None."""
        return min((e.expires for e in self._entries.values()), default=None)


def choose_drafter(
    table: StatusTable, contract: Contract, now: float, *, exclude: Iterable[str] = ()
) -> str | None:
    """A live drafter whose model the contract permits, by the policy in the module doc."""
    excluded = set(exclude)
    candidates = []
    for status in table.live_drafters(now):
        if status.instance in excluded:
            continue
        model = table.model_of(status.instance)
        if contract.drafters is not None and (model is None or not permits_drafter(contract, model)):
            continue
        candidates.append(status)
    if not candidates:
        return None
    best = min(candidates, key=lambda s: (s.load, s.queue, -(s.accept_milli or 0), s.instance))
    return best.instance


def choose_verifier(table: StatusTable, now: float, *, exclude: Iterable[str] = ()) -> str | None:
    """A live verifier for a new session or a fail-over: the lowest (load, queue, instance)."""
    excluded = set(exclude)
    candidates = [s for s in table.live_verifiers(now) if s.instance not in excluded]
    if not candidates:
        return None
    return min(candidates, key=lambda s: (s.load, s.queue, s.instance)).instance
