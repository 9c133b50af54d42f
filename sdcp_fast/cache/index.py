"""The multi-level cache: an index over tiers with LRU, leases and accounting.

Synchronous core; time comes from an injected clock (seconds, monotonic) so lease tests
need no sleeps. One lock guards the index: tiers are only touched under it.

Placement: a put goes to the fastest tier with room, making room by demoting that tier's
least recently used unleased objects one tier down (dropped off the last tier: an
eviction). A read promotes the object to the fastest tier Python can read. A leased object
is never evicted, demoted or deleted; a lease that expires unreleased reclaims the object
if the object was put under that lease (its holder is gone), otherwise it only unpins it.
A birth lease released with ``drop`` deletes its object once no other lease holds it.

Memory is bounded: object bytes by the tier capacities, the index by ``max_objects`` and
``index_bytes`` (each object's metadata plus a fixed per-object charge), leases by
``max_leases`` and ``MAX_LEASE_TTL``, per-scope accounting by ``max_scopes`` rows
(:mod:`sdcp_fast.cache.stats`). Lease ids are 128 random bits. Callers that act for a
remote peer pass ``owner``/``holder`` and a ``check`` that the store runs under its lock,
so an authorization decision and the change it allows are one atomic step.

Why one module of this length: :class:`MLC` is one object whose index, LRU order, leases,
accounting and tier placement change together under its one lock (a put makes room by
demoting and evicting, charges the index and its scope, and may grant a lease, in one step;
a read promotes by swapping rooms between tiers). Split apart, each part would need the
others' invariants and the lock; what stands alone is elsewhere already (the tiers in
:mod:`sdcp_fast.cache.tiers`, accounting in :mod:`sdcp_fast.cache.stats`, names in
:mod:`sdcp_fast.cache.uri`, authorization in :mod:`sdcp_fast.cache.policy`).
"""

from __future__ import annotations

import errno
import functools
import heapq
import itertools
import os
import secrets
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from sdcp_fast.cache.failures import BadRange, CacheFull, ObjectLeased, ObjectUnavailable, UnknownLease
from sdcp_fast.cache.stats import MAX_SCOPES, Accounting
from sdcp_fast.cache.tiers.tier import Tier
from sdcp_fast.cache.uri import check_key, parse, scope_of
from sdcp_fast.protocol.cbor import deterministic_cbor
from sdcp_fast.protocol.problems import BadRequest

Clock = Callable[[], float]
MISS = "-"
# A lease pins an object for a round or a session's hand-over, never for longer.
MAX_LEASE_TTL = 3600.0
MAX_META_BYTES = 64 << 10
# What an object costs beside its bytes: the index entry, its LRU slot and the tier's
# handle (a host buffer is at least one page). Measured at ~5 KiB for empty host objects.
OBJECT_OVERHEAD = 4096
MAX_OBJECTS = 1 << 18
INDEX_BYTES = 1 << 30
MAX_LEASES = 1 << 18
# A round's objects are held by their writer and a verifier; more holders mean a caller
# that never releases, which must not fill the lease table through one object.
MAX_LEASES_PER_OBJECT = 16
# What a tier's write raises when the file system under it has less room than its capacity.
_OUT_OF_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
# What a takeover on another host reads: the target's KV pages, the prompt's KV and the
# committed tokens. They are placed in a tier that outlives the writer's host (``outlives_host``:
# Mooncake Store or Redis) when there is one, and stay there.
OUTLIVE_HOST = frozenset({"target_kv", "prompt_kv", "committed_tokens"})


@functools.lru_cache(maxsize=4096)
def must_outlive_host(uri: str) -> bool:
    try:
        return parse(uri).kind in OUTLIVE_HOST
    except ValueError:
        return False


@dataclass
class _Entry:
    uri: str
    scope: str
    size: int
    tier: int
    handle: Any
    etag: str
    meta: dict[str, Any]
    owner: str | None = None  # who wrote it (a peer's identity), None for in-process callers
    charge: int = OBJECT_OVERHEAD  # index memory: overhead plus encoded metadata
    leases: set[str] = field(default_factory=set)
    birth_lease: str | None = None  # put under this lease: reclaimed if it expires unreleased
    reclaim: bool = False
    spent: bool = False  # its birth lease was released with ``drop``: deleted when the last lease goes
    borrowed: bool = False  # the handle is another instance's object in a shared tier: never drop it


class Head(NamedTuple):
    size: int
    etag: str
    tier: str
    leased: bool
    meta: dict[str, Any]
    owner: str | None = None


class _Lease(NamedTuple):
    uri: str
    expires: float
    holder: str | None


# Authorization hooks run under the store's lock: an object check sees the object's head
# (None when a put creates it), a lease check sees the lease's holder; both raise to refuse.
ObjectCheck = Callable[["Head | None"], None]
LeaseCheck = Callable[["str | None"], None]
Span = Callable[[int], "tuple[int, int]"]


def check_ttl(ttl: float) -> float:
    """A lease TTL in seconds: positive, finite, at most ``MAX_LEASE_TTL``."""
    if isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not 0 < ttl <= MAX_LEASE_TTL:
        raise ValueError(f"lease ttl must be in (0, {MAX_LEASE_TTL:g}] seconds, not {ttl!r}")
    return float(ttl)


def meta_size(meta: dict[str, Any]) -> int:
    """Bytes of the metadata's CBOR encoding (what the HTTP API sends back; what its limit counts)."""
    try:
        return len(deterministic_cbor(meta))
    except BadRequest:  # not encodable (a float, say): sized by its repr
        return len(repr(meta))


def meta_cost(meta: dict[str, Any], encoded: int | None = None) -> int:
    """Bytes the metadata holds in memory, at least its encoded size: a decoded container
    costs far more than the byte or two that encode it (``[[]] * 65000`` is 65 KB of CBOR
    and ~4.6 MB of lists), so the index is charged what the objects take."""
    total, seen, stack = 0, set(), [meta]
    while stack:
        o: Any = stack.pop()
        if isinstance(o, (dict, list, tuple)):
            if id(o) in seen:  # held once however often it is referred to (and no cycle loops)
                continue
            seen.add(id(o))
            if isinstance(o, dict):
                stack.extend(o.keys())
                stack.extend(o.values())
            else:
                stack.extend(o)
        total += sys.getsizeof(o)
    return max(total, meta_size(meta) if encoded is None else encoded)


class Stored(NamedTuple):
    etag: str
    tier: str
    lease: str | None


class MLC:
    def __init__(self, tiers: Sequence[Tier], *, clock: Clock = time.monotonic, prefetch_workers: int = 2,
                 max_objects: int = MAX_OBJECTS, index_bytes: int = INDEX_BYTES,
                 max_leases: int = MAX_LEASES, max_scopes: int = MAX_SCOPES) -> None:
        if not tiers:
            raise ValueError("an MLC needs at least one tier")
        self.tiers = list(tiers)
        self._clock = clock
        self._lock = threading.RLock()
        self._index: dict[str, _Entry] = {}
        self._lru: list[OrderedDict[str, None]] = [OrderedDict() for _ in self.tiers]
        self._used = [0] * len(self.tiers)
        self._leases: dict[str, _Lease] = {}
        self._expiry: list[tuple[float, str]] = []
        self._ids = itertools.count(1)
        self._instance = os.urandom(4).hex()
        self.accounting = Accounting(max_scopes)
        self.max_objects, self.index_bytes, self.max_leases = max_objects, index_bytes, max_leases
        self._index_used = 0
        self._prefetch = ThreadPoolExecutor(prefetch_workers, thread_name_prefix="mlc-prefetch")
        # Reads promote into the fastest tier whose bytes Python can see without a copy.
        self._deferring = [t for t in self.tiers if hasattr(t, "flush")]
        self._read_tier = next((i for i, t in enumerate(self.tiers) if t.host_readable), len(self.tiers) - 1)
        self._outliving = next((i for i, t in enumerate(self.tiers) if getattr(t, "outlives_host", False)), None)

    # -- objects ---------------------------------------------------------------------------

    def put(self, uri: str, data: Any, lease_ttl: float | None = None, *,
            meta: dict[str, Any] | None = None, owner: str | None = None,
            check: ObjectCheck | None = None) -> Stored:
        """Store a copy of ``data`` (buffer or tensor). With ``lease_ttl`` the object is born
        leased (held by ``owner``) and is reclaimed if that lease expires unreleased."""
        check_key(uri)
        if lease_ttl is not None:
            check_ttl(lease_ttl)
        is_tensor = hasattr(data, "untyped_storage")
        size = int(data.numel() * data.element_size()) if is_tensor else memoryview(data).nbytes
        if meta is not None and not isinstance(meta, dict):
            raise ValueError(f"meta must be a map, not {type(meta).__name__}")
        meta = dict(meta) if meta else {}
        if is_tensor:
            meta.setdefault("dtype", str(data.dtype).removeprefix("torch."))
            meta.setdefault("shape", list(data.shape))
        encoded = meta_size(meta) if meta else 0
        if encoded > MAX_META_BYTES:
            raise ValueError(f"meta of {encoded} bytes; at most {MAX_META_BYTES}")
        charge = OBJECT_OVERHEAD + (meta_cost(meta, encoded) if meta else 0)
        with self._lock:
            now = self._reap()
            old = self._index.get(uri)
            if check is not None:
                check(None if old is None else self._head(old))
            if old is not None and old.leases:
                raise ObjectLeased(f"{uri} is leased and cannot be replaced")
            if old is not None:
                self._remove(old)
            if lease_ttl is not None and len(self._leases) >= self.max_leases:
                raise CacheFull(f"{len(self._leases)} leases are held; at most {self.max_leases}")
            self._make_index_room(charge, keep={uri})
            start = 0 if is_tensor and data.device.type == "cuda" else self._read_tier
            full = ""
            for i in self._placement(uri, start):
                if (size <= self.tiers[i].capacity and self._could_hold(i, size, keep={uri})
                        and self._make_room(i, size, keep={uri})):
                    try:
                        handle = self._write(i, uri, data, size, keep={uri})
                        break
                    except CacheFull as exc:
                        full = f" ({exc.detail})"
                    except ConnectionError:
                        if i != self._outliving:
                            raise
                        # Unreachable: this host's tiers keep it; a takeover elsewhere recomputes it.
            else:
                raise CacheFull(f"{size} bytes fit in no tier{full}")
            entry = _Entry(uri, scope_of(uri), size, i, handle, f'"{self._instance}-{next(self._ids)}"', meta,
                           owner=owner, charge=charge)
            self._insert(entry)
            lease = self._grant(entry, lease_ttl, now, owner) if lease_ttl is not None else None
            entry.birth_lease = lease
            return Stored(entry.etag, self.tiers[i].name, lease)

    def stores_as_is(self, data: Any, size: int, uri: str | None = None) -> bool:
        """Whether a put of ``data`` now would keep it without a copy or a move: ``bytes``
        that the fastest host-readable tier keeps as they are (``adopts_bytes``) and that fit
        there beside what it holds, and not bound for the networked tier (``uri``). A hint for
        where to run the put (read without the lock)."""
        if uri is not None and self._outliving is not None and must_outlive_host(uri):
            return False
        i = self._read_tier
        tier = self.tiers[i]
        return type(data) is bytes and getattr(tier, "adopts_bytes", False) and self._used[i] + size <= tier.capacity

    def reads_as_view(self, head: Head) -> bool:
        """Whether reading the object of ``head`` gives a view of its stored bytes with no copy
        and no move (it is in the tier reads promote to, which Python reads in place)."""
        tier = self.tiers[self._read_tier]
        return tier.host_readable and head.tier == tier.name

    def get(self, uri: str) -> memoryview:
        """The whole object; a read-only view of the stored bytes (no copy) on host tiers."""
        with self._lock:
            return self._read_whole(self._lookup(uri))

    def read(self, uri: str, span: Span | None = None, *, check: ObjectCheck | None = None) -> tuple[Head, memoryview]:
        """The object's head and its bytes, taken together under the lock so the entity tag
        describes exactly those bytes (a concurrent put cannot slip between them). ``span``
        maps the size to the [start, stop) wanted (raising BadRange); without it the whole
        object is read and promoted."""
        with self._lock:
            entry = self._lookup(uri)
            if check is not None:
                check(self._head(entry))
            if span is None:
                view = self._read_whole(entry)
            else:
                start, stop = span(entry.size)
                view = self._read_range(entry, start, stop)
            return self._head(entry), view

    def get_range(self, uri: str, start: int, stop: int | None = None) -> memoryview:
        """Bytes [start, stop) without moving the object."""
        with self._lock:
            return self._read_range(self._lookup(uri), start, stop)

    def get_into(self, uri: str, out: Any) -> int:
        """Copy the whole object into the caller's writable buffer ``out`` (e.g. a pinned
        staging buffer); returns its size. One copy, straight from the tier; the object is
        not moved."""
        view = memoryview(out).cast("B")
        if view.readonly:
            raise ValueError("get_into needs a writable buffer")
        with self._lock:
            entry = self._lookup(uri)
            if entry.size > view.nbytes:
                raise BadRange(f"{uri} has {entry.size} bytes; the buffer holds {view.nbytes}")
            tier = self.tiers[entry.tier]
            self._lru[entry.tier].move_to_end(uri)
            reader = getattr(tier, "read_into", None)
            if reader is not None:
                return int(reader(entry.handle, view))
            view[: entry.size] = tier.read(entry.handle)
            return entry.size

    def get_tensor(self, uri: str, device: str | None = None) -> Any:
        """The object as a tensor (dtype/shape from a tensor put, else flat uint8). On
        ``device='cuda'`` it is promoted to the device tier when there is one. On the host
        and device tiers the tensor shares the stored bytes: read it, do not write it."""
        import torch

        with self._lock:
            entry = self._lookup(uri)
            want_device = device is not None and device != "cpu"
            target = 0 if want_device else self._read_tier
            self._promote(entry, target)
            tier = self.tiers[entry.tier]
            flat = tier.tensor(entry.handle) if hasattr(tier, "tensor") else torch.frombuffer(
                bytearray(tier.read(entry.handle)), dtype=torch.uint8)
            if want_device and tier.host_readable:  # no device tier, or no room on it
                flat = flat.to(device, non_blocking=flat.device.type == "cpu" and flat.is_pinned())
            dtype = getattr(torch, str(entry.meta.get("dtype", "uint8")), None)
            if not isinstance(dtype, torch.dtype):
                raise ValueError(f"{uri} has no usable dtype in its metadata: {entry.meta.get('dtype')!r}")
            out = flat.view(dtype)
            return out.reshape(entry.meta["shape"]) if "shape" in entry.meta else out

    def head(self, uri: str, *, check: ObjectCheck | None = None) -> Head:
        with self._lock:
            head = self._head(self._lookup(uri, count=False))
            if check is not None:
                check(head)
            return head

    def contains(self, uri: str) -> bool:
        with self._lock:
            self._reap()
            return uri in self._index

    def delete(self, uri: str, *, check: ObjectCheck | None = None) -> None:
        with self._lock:
            entry = self._lookup(uri, count=False)
            if check is not None:
                check(self._head(entry))
            if entry.leases:
                raise ObjectLeased(f"{uri} is leased and cannot be deleted")
            self._remove(entry)
            self._flush()

    def prefetch(self, uris: Iterable[str]) -> Future[list[bool]]:
        """Promote objects in the background (e.g. q rows while the verifier scores);
        the future says which were present."""
        wanted = list(uris)

        def run() -> list[bool]:
            out = []
            for uri in wanted:
                with self._lock:
                    self._reap()
                    entry = self._index.get(uri)
                    if entry is not None:
                        self._promote(entry, self._read_tier)
                    out.append(entry is not None)
            return out

        return self._prefetch.submit(run)

    # -- leases ----------------------------------------------------------------------------

    def lease(self, uri: str, ttl: float, *, holder: str | None = None, check: ObjectCheck | None = None) -> str:
        check_ttl(ttl)
        with self._lock:
            now = self._reap()
            entry = self._lookup(uri, count=False)
            if check is not None:
                check(self._head(entry))
            if len(self._leases) >= self.max_leases or len(entry.leases) >= MAX_LEASES_PER_OBJECT:
                raise CacheFull(f"{len(self._leases)} leases are held, {len(entry.leases)} on {uri}; at most "
                                f"{self.max_leases} and {MAX_LEASES_PER_OBJECT} per object")
            return self._grant(entry, ttl, now, holder)

    def renew(self, lease_id: str, ttl: float, *, check: LeaseCheck | None = None) -> None:
        check_ttl(ttl)
        with self._lock:
            now = self._reap()
            held = self._held(lease_id)
            if check is not None:
                check(held.holder)
            self._leases[lease_id] = held._replace(expires=now + ttl)
            heapq.heappush(self._expiry, (now + ttl, lease_id))
            self._compact_expiry()

    def release(self, lease_id: str, *, drop: bool = False, check: LeaseCheck | None = None) -> None:
        """Unpin: the object stays until LRU evicts it or someone deletes it. With ``drop``,
        the release of an object's birth lease also says the object is spent (a round's q
        rows after its verdict): it is deleted once no other lease holds it, instead of
        waiting in the LRU and being demoted to a slower tier to make room."""
        with self._lock:
            self._reap()
            held = self._held(lease_id)
            if check is not None:
                check(held.holder)
            uri = held.uri
            del self._leases[lease_id]
            entry = self._index[uri]
            entry.leases.discard(lease_id)
            if entry.birth_lease == lease_id:
                entry.birth_lease = None
                entry.spent = drop
            if entry.spent and not entry.leases:
                self._remove(entry)
                self._flush()
            self._compact_expiry()

    @contextmanager
    def held_if_free(self) -> Iterator[bool]:
        """Hold the store's lock if nobody else does (True), without waiting. An event loop
        runs a quick call inline only then: a worker thread copying a large object holds the
        lock for a long time, and the loop must not wait for it."""
        got = self._lock.acquire(blocking=False)
        try:
            yield got
        finally:
            if got:
                self._lock.release()

    # -- stats ---------------------------------------------------------------------------

    @property
    def root(self) -> str | None:
        """The disk tier's folder (where a composed store keeps its commit logs), if any."""
        roots = (getattr(t, "root", None) for t in self.tiers)
        return next((r for r in roots if isinstance(r, str)), None)

    def stats(self) -> dict[str, Any]:
        with self._lock:
            self._reap()
            return {
                "tiers": [
                    {"name": t.name, "capacity": t.capacity, "used": self._used[i], "objects": len(self._lru[i])}
                    for i, t in enumerate(self.tiers)
                ],
                "leases": len(self._leases),
                "index": {"objects": len(self._index), "max_objects": self.max_objects,
                          "bytes": self._index_used, "capacity": self.index_bytes},
                "scopes": self.accounting.snapshot(),
            }

    def close(self) -> None:
        self._prefetch.shutdown(wait=True)
        with self._lock:
            for entry in list(self._index.values()):
                self._remove(entry)
            for t in self.tiers:
                t.close()

    def __enter__(self) -> MLC:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals (lock held) -------------------------------------------------------------

    def _flush(self) -> None:
        for t in self._deferring:
            t.flush()

    def _reap(self) -> float:
        self._flush()
        now = self._clock()
        while self._expiry and self._expiry[0][0] <= now:
            when, lease_id = heapq.heappop(self._expiry)
            held = self._leases.get(lease_id)
            if held is None or held.expires != when:
                continue  # released or renewed since
            del self._leases[lease_id]
            entry = self._index.get(held.uri)
            if entry is None:
                continue
            entry.leases.discard(lease_id)
            if entry.birth_lease == lease_id:
                entry.reclaim = True
            if entry.reclaim and not entry.leases:
                self.accounting[entry.scope, self.tiers[entry.tier].name].evictions += 1
                self._remove(entry)
                self._flush()
            elif entry.spent and not entry.leases:
                self._remove(entry)
                self._flush()
        return now

    def _compact_expiry(self) -> None:
        if len(self._expiry) > 2 * len(self._leases) + 64:
            # Renewals, releases and deletions leave expiries behind; rebuild from the live
            # leases so the heap stays proportional to them, not to the leases ever granted.
            self._expiry = [(lease.expires, lid) for lid, lease in self._leases.items()]
            heapq.heapify(self._expiry)

    def _lookup(self, uri: str, *, count: bool = True) -> _Entry:
        self._reap()
        entry = self._index.get(uri)
        if entry is None:
            entry = self._adopt(uri)
        if entry is None:
            if count:
                self.accounting[scope_of(uri), MISS].misses += 1
            raise ObjectUnavailable(f"{uri} is not in the cache (never stored, deleted, evicted or expired)")
        if count:
            self.accounting[entry.scope, self.tiers[entry.tier].name].hits += 1
        self._lru[entry.tier].move_to_end(uri)
        return entry

    def _adopt(self, uri: str) -> _Entry | None:
        """An object another MLC instance left in a shared networked tier."""
        for i, t in enumerate(self.tiers):
            probe = getattr(t, "probe", None)
            try:
                size = probe(uri) if probe is not None else None
            except ConnectionError:  # unreachable: as far as anyone here can tell, not there
                continue
            if size is not None:
                entry = _Entry(uri, scope_of(uri), size, i, t.prefix + uri,  # type: ignore[attr-defined]
                               f'"{self._instance}-{next(self._ids)}"', {}, borrowed=True)
                self._insert(entry)
                return entry
        return None

    def _read_whole(self, entry: _Entry) -> memoryview:
        try:
            self._promote(entry, self._read_tier)
            return self.tiers[entry.tier].read(entry.handle)
        except KeyError:  # a shared tier lost it (another instance deleted it)
            self._remove(entry)
            raise ObjectUnavailable(f"{entry.uri} vanished from tier {self.tiers[entry.tier].name}") from None

    def _read_range(self, entry: _Entry, start: int, stop: int | None) -> memoryview:
        stop = entry.size if stop is None else stop
        if not 0 <= start <= stop <= entry.size:
            raise BadRange(f"[{start}, {stop}) outside {entry.size} bytes", extra={"size": entry.size})
        self._lru[entry.tier].move_to_end(entry.uri)
        return self.tiers[entry.tier].read_range(entry.handle, start, stop)

    def _head(self, entry: _Entry) -> Head:
        return Head(entry.size, entry.etag, self.tiers[entry.tier].name, bool(entry.leases), dict(entry.meta),
                    entry.owner)

    def _grant(self, entry: _Entry, ttl: float, now: float, holder: str | None) -> str:
        check_ttl(ttl)
        lease_id = secrets.token_hex(16)  # unguessable: a lease id is what lets its holder release it
        self._leases[lease_id] = _Lease(entry.uri, now + ttl, holder)
        heapq.heappush(self._expiry, (now + ttl, lease_id))
        entry.leases.add(lease_id)
        return lease_id

    def _make_index_room(self, charge: int, *, keep: set[str]) -> None:
        """Evict least recently used unleased objects, slowest tier first, until one more
        object of ``charge`` index bytes fits under ``max_objects`` and ``index_bytes``."""
        while len(self._index) >= self.max_objects or self._index_used + charge > self.index_bytes:
            victim = next((self._index[u] for lru in reversed(self._lru) for u in lru
                           if u not in keep and not self._index[u].leases), None)
            if victim is None:
                raise CacheFull(f"the index holds {len(self._index)} objects and {self._index_used} bytes "
                                f"(at most {self.max_objects} and {self.index_bytes}); all are leased")
            self.accounting[victim.scope, self.tiers[victim.tier].name].evictions += 1
            self._remove(victim)

    def _held(self, lease_id: str) -> _Lease:
        held = self._leases.get(lease_id)
        if held is None:
            raise UnknownLease(f"lease {lease_id} is unknown, released or expired")
        return held

    def _insert(self, entry: _Entry) -> None:
        entry.scope = self.accounting.admit(entry.scope)  # the row it is counted under
        self._index[entry.uri] = entry
        self._index_used += entry.charge
        self._lru[entry.tier][entry.uri] = None
        self._used[entry.tier] += entry.size
        self.accounting.added(entry.scope, self.tiers[entry.tier].name, entry.size)

    def _unlink(self, entry: _Entry) -> Any:
        del self._lru[entry.tier][entry.uri]
        self._used[entry.tier] -= entry.size
        self.accounting.removed(entry.scope, self.tiers[entry.tier].name, entry.size)
        handle, entry.handle = entry.handle, None
        return handle

    def _remove(self, entry: _Entry) -> None:
        del self._index[entry.uri]
        self._index_used -= entry.charge
        for lease_id in entry.leases:
            self._leases.pop(lease_id, None)
        if entry.leases:
            self._compact_expiry()
        tier = self.tiers[entry.tier]
        if entry.borrowed:
            self._unlink(entry)
        else:
            tier.drop(self._unlink(entry))
        self.accounting.leave(entry.scope)

    def _make_room(self, i: int, size: int, *, keep: set[str]) -> bool:
        """Free ``size`` bytes in tier i by demoting its LRU unleased objects; objects in
        ``keep`` (the one being placed, and those being moved on its behalf) stay."""
        tier = self.tiers[i]
        if size > tier.capacity:
            return False
        while tier.capacity - self._used[i] < size:
            victim = next((self._index[u] for u in self._lru[i] if u not in keep and not self._index[u].leases),
                          None)
            if victim is None:
                return False
            self._move_down(victim, keep)
        return True

    def _could_hold(self, i: int, size: int, *, keep: set[str]) -> bool:
        """Whether tier i's file system could take ``size`` bytes once its LRU unleased
        objects made way: a tier may claim more than the file system under it has, and an
        object that fits neither way must be refused before anything is evicted for it."""
        free_space = getattr(self.tiers[i], "free_space", None)
        if free_space is None:
            return True
        try:
            free = int(free_space())
        except OSError:
            return True  # unknown: the write itself tells
        if size <= free:
            return True
        reclaimable = sum(e.size for u in self._lru[i] if u not in keep and not (e := self._index[u]).leases)
        return size <= free + reclaimable

    def _write(self, i: int, uri: str, data: Any, size: int, *, keep: set[str]) -> Any:
        """``tiers[i].write``; when the file system under the tier is fuller than its
        accounting says (ENOSPC), the tier's LRU unleased objects make way one by one while
        they could still make room for ``size`` bytes; otherwise the write is CacheFull (507),
        never a bare OSError."""
        tier = self.tiers[i]
        while True:
            try:
                return tier.write(uri, data)
            except OSError as exc:
                if exc.errno not in _OUT_OF_SPACE:
                    raise
                victim = next((self._index[u] for u in self._lru[i] if u not in keep and not self._index[u].leases),
                              None)
                if victim is None or not self._could_hold(i, size, keep=keep | {uri}):
                    raise CacheFull(f"tier {tier.name} is out of space: {exc.strerror}") from None
                self._move_down(victim, keep | {uri})

    def _move_down(self, entry: _Entry, keep: set[str]) -> None:
        src = entry.tier
        for j in range(src + 1, len(self.tiers)):
            if self._make_room(j, entry.size, keep=keep | {entry.uri}):
                try:
                    self._move(entry, j, keep=keep | {entry.uri})
                except CacheFull:
                    continue
                return
        self.accounting[entry.scope, self.tiers[src].name].evictions += 1
        self._remove(entry)

    def _placement(self, uri: str, start: int) -> list[int]:
        """The tiers a put tries, in order: fastest first from ``start``, but an object that
        must outlive its writer's host first in the tier that does."""
        order = list(range(start, len(self.tiers)))
        if self._outliving is not None and must_outlive_host(uri):
            order = [self._outliving] + [i for i in order if i != self._outliving]
        return order

    def _promote(self, entry: _Entry, target: int) -> None:
        if entry.tier <= target or (entry.tier == self._outliving and must_outlive_host(entry.uri)):
            return  # reads of an object kept for a takeover leave it where it outlives its writer
        src = entry.tier
        for j in range(target, src):
            # The object leaves its tier: what moves down to make room for it may take its
            # place there (a swap), instead of pushing a third object out.
            self._used[src] -= entry.size
            try:
                room = self._make_room(j, entry.size, keep={entry.uri})
            finally:
                self._used[src] += entry.size
            if room:
                try:
                    self._move(entry, j, keep={entry.uri})
                except CacheFull:
                    self._make_room(src, 0, keep={entry.uri})  # it stayed: give back what it lent
                    continue  # served from where it is
                return

    def _move(self, entry: _Entry, j: int, *, keep: set[str]) -> None:
        src = self.tiers[entry.tier]
        dst = self.tiers[j]
        new = None
        if not dst.host_readable and getattr(src, "gds", False):
            # Disk -> device through GDS: no bounce through host memory.
            new = dst.empty(entry.size)  # type: ignore[attr-defined]
            if not src.read_into_device(entry.handle, new):  # type: ignore[attr-defined]
                new = None
        if new is None:
            # Between device and host, hand over tensors: a pinned host tensor lets the copy
            # run on the side stream without a pageable bounce.
            as_tensor = hasattr(src, "tensor") and not (src.host_readable and dst.host_readable)
            data = src.tensor(entry.handle) if as_tensor else src.read(entry.handle)  # type: ignore[attr-defined]
            try:
                new = self._write(j, entry.uri, data, entry.size, keep=keep)
            finally:
                del data
        if entry.borrowed:
            self._unlink(entry)
            entry.borrowed = False
        else:
            src.drop(self._unlink(entry))
        entry.tier, entry.handle = j, new
        self._lru[j][entry.uri] = None
        self._used[j] += entry.size
        self.accounting.added(entry.scope, dst.name, entry.size)

