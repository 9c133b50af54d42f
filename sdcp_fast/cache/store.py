"""The multi-level cache: an index over tiers with LRU, leases and accounting.

Synchronous core; time comes from an injected clock (seconds, monotonic) so lease tests
need no sleeps. One lock guards the index: tiers are only touched under it.

Placement: a put goes to the fastest tier with room, making room by demoting that tier's
least recently used unleased objects one tier down (dropped off the last tier: an
eviction). A read promotes the object to the fastest tier Python can read. A leased object
is never evicted, demoted or deleted; a lease that expires unreleased reclaims the object
if the object was put under that lease (its holder is gone), otherwise it only unpins it.
"""

from __future__ import annotations

import heapq
import itertools
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from sdcp_fast.cache.errors import BadRange, CacheFull, ObjectLeased, ObjectUnavailable, UnknownLease
from sdcp_fast.cache.stats import Accounting
from sdcp_fast.cache.tiers.base import Tier
from sdcp_fast.cache.uri import check_key, scope_of

Clock = Callable[[], float]
MISS = "-"


@dataclass
class _Entry:
    uri: str
    scope: str
    size: int
    tier: int
    handle: Any
    etag: str
    meta: dict[str, Any]
    leases: set[str] = field(default_factory=set)
    birth_lease: str | None = None  # put under this lease: reclaimed if it expires unreleased
    reclaim: bool = False
    borrowed: bool = False  # the handle is another instance's object in a shared tier: never drop it


class Head(NamedTuple):
    size: int
    etag: str
    tier: str
    leased: bool
    meta: dict[str, Any]


class Stored(NamedTuple):
    etag: str
    tier: str
    lease: str | None


class MLC:
    def __init__(self, tiers: Sequence[Tier], *, clock: Clock = time.monotonic,
                 log_root: str | None = None, prefetch_workers: int = 2) -> None:
        if not tiers:
            raise ValueError("an MLC needs at least one tier")
        self.tiers = list(tiers)
        self._clock = clock
        self._lock = threading.RLock()
        self._index: dict[str, _Entry] = {}
        self._lru: list[OrderedDict[str, None]] = [OrderedDict() for _ in self.tiers]
        self._used = [0] * len(self.tiers)
        self._leases: dict[str, tuple[str, float]] = {}
        self._expiry: list[tuple[float, str]] = []
        self._ids = itertools.count(1)
        self._instance = os.urandom(4).hex()
        self.accounting = Accounting()
        self.log_root = log_root
        self._logs: dict[str, Any] = {}
        self._prefetch = ThreadPoolExecutor(prefetch_workers, thread_name_prefix="mlc-prefetch")
        # Reads promote into the fastest tier whose bytes Python can see without a copy.
        self._deferring = [t for t in self.tiers if hasattr(t, "flush")]
        self._read_tier = next((i for i, t in enumerate(self.tiers) if t.host_readable), len(self.tiers) - 1)

    # -- objects ---------------------------------------------------------------------------

    def put(self, uri: str, data: Any, lease_ttl: float | None = None, *,
            meta: dict[str, Any] | None = None) -> Stored:
        """Store a copy of ``data`` (buffer or tensor). With ``lease_ttl`` the object is born
        leased and is reclaimed if that lease expires unreleased."""
        check_key(uri)
        if lease_ttl is not None and lease_ttl <= 0:
            raise ValueError("lease ttl must be positive")
        is_tensor = hasattr(data, "untyped_storage")
        size = int(data.numel() * data.element_size()) if is_tensor else memoryview(data).nbytes
        meta = dict(meta) if meta else {}
        if is_tensor:
            meta.setdefault("dtype", str(data.dtype).removeprefix("torch."))
            meta.setdefault("shape", list(data.shape))
        with self._lock:
            now = self._reap()
            old = self._index.get(uri)
            if old is not None and old.leases:
                raise ObjectLeased(f"{uri} is leased and cannot be replaced")
            if old is not None:
                self._remove(old)
            start = 0 if is_tensor and data.device.type == "cuda" else self._read_tier
            for i in range(start, len(self.tiers)):
                if size <= self.tiers[i].capacity and self._make_room(i, size, keep={uri}):
                    handle = self.tiers[i].write(uri, data)
                    break
            else:
                raise CacheFull(f"{size} bytes fit in no tier")
            entry = _Entry(uri, scope_of(uri), size, i, handle, f'"{self._instance}-{next(self._ids)}"', meta)
            self._insert(entry)
            lease = self._grant(entry, lease_ttl, now) if lease_ttl is not None else None
            entry.birth_lease = lease
            return Stored(entry.etag, self.tiers[i].name, lease)

    def get(self, uri: str) -> memoryview:
        """The whole object; a read-only view of the stored bytes (no copy) on host tiers."""
        with self._lock:
            entry = self._lookup(uri)
            try:
                self._promote(entry, self._read_tier)
                return self.tiers[entry.tier].read(entry.handle)
            except KeyError:  # a shared tier lost it (another instance deleted it)
                self._remove(entry)
                raise ObjectUnavailable(f"{uri} vanished from tier {self.tiers[entry.tier].name}") from None

    def get_range(self, uri: str, start: int, stop: int | None = None) -> memoryview:
        """Bytes [start, stop) without moving the object."""
        with self._lock:
            entry = self._lookup(uri)
            stop = entry.size if stop is None else stop
            if not 0 <= start <= stop <= entry.size:
                raise BadRange(f"[{start}, {stop}) outside {entry.size} bytes")
            self._lru[entry.tier].move_to_end(uri)
            return self.tiers[entry.tier].read_range(entry.handle, start, stop)

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

    def head(self, uri: str) -> Head:
        with self._lock:
            entry = self._lookup(uri, count=False)
            return Head(entry.size, entry.etag, self.tiers[entry.tier].name, bool(entry.leases), dict(entry.meta))

    def contains(self, uri: str) -> bool:
        with self._lock:
            self._reap()
            return uri in self._index

    def delete(self, uri: str) -> None:
        with self._lock:
            entry = self._lookup(uri, count=False)
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

    def lease(self, uri: str, ttl: float) -> str:
        with self._lock:
            now = self._reap()
            return self._grant(self._lookup(uri, count=False), ttl, now)

    def renew(self, lease_id: str, ttl: float) -> None:
        if ttl <= 0:
            raise ValueError("lease ttl must be positive")
        with self._lock:
            now = self._reap()
            uri, _ = self._held(lease_id)
            self._leases[lease_id] = (uri, now + ttl)
            heapq.heappush(self._expiry, (now + ttl, lease_id))

    def release(self, lease_id: str) -> None:
        """Unpin: the object stays until LRU evicts it or someone deletes it."""
        with self._lock:
            self._reap()
            uri, _ = self._held(lease_id)
            del self._leases[lease_id]
            entry = self._index[uri]
            entry.leases.discard(lease_id)
            if entry.birth_lease == lease_id:
                entry.birth_lease = None

    # -- commit logs and stats -------------------------------------------------------------

    def commit_log(self, uri: str) -> Any:
        """The embedded (file) commit log named ``uri``; one instance per name per MLC."""
        from sdcp_fast.commitlog.file import FileCommitLog, log_path

        if self.log_root is None:
            raise ObjectUnavailable("this MLC has no log_root for commit logs")
        with self._lock:
            log = self._logs.get(uri)
            if log is None:
                log = self._logs[uri] = FileCommitLog(log_path(self.log_root, uri))
            return log

    def stats(self) -> dict[str, Any]:
        with self._lock:
            self._reap()
            return {
                "tiers": [
                    {"name": t.name, "capacity": t.capacity, "used": self._used[i], "objects": len(self._lru[i])}
                    for i, t in enumerate(self.tiers)
                ],
                "leases": len(self._leases),
                "scopes": self.accounting.snapshot(),
            }

    def close(self) -> None:
        self._prefetch.shutdown(wait=True)
        with self._lock:
            for entry in list(self._index.values()):
                self._remove(entry)
            for log in self._logs.values():
                log.close()
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
            if held is None or held[1] != when:
                continue  # released or renewed since
            del self._leases[lease_id]
            entry = self._index.get(held[0])
            if entry is None:
                continue
            entry.leases.discard(lease_id)
            if entry.birth_lease == lease_id:
                entry.reclaim = True
            if entry.reclaim and not entry.leases:
                self.accounting[entry.scope, self.tiers[entry.tier].name].evictions += 1
                self._remove(entry)
                self._flush()
        return now

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
            size = probe(uri) if probe is not None else None
            if size is not None:
                entry = _Entry(uri, scope_of(uri), size, i, t.prefix + uri,  # type: ignore[attr-defined]
                               f'"{self._instance}-{next(self._ids)}"', {}, borrowed=True)
                self._insert(entry)
                return entry
        return None

    def _grant(self, entry: _Entry, ttl: float, now: float) -> str:
        if ttl <= 0:
            raise ValueError("lease ttl must be positive")
        lease_id = f"{self._instance}-{next(self._ids)}"
        self._leases[lease_id] = (entry.uri, now + ttl)
        heapq.heappush(self._expiry, (now + ttl, lease_id))
        entry.leases.add(lease_id)
        return lease_id

    def _held(self, lease_id: str) -> tuple[str, float]:
        held = self._leases.get(lease_id)
        if held is None:
            raise UnknownLease(f"lease {lease_id} is unknown, released or expired")
        return held

    def _insert(self, entry: _Entry) -> None:
        self._index[entry.uri] = entry
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
        for lease_id in entry.leases:
            self._leases.pop(lease_id, None)
        tier = self.tiers[entry.tier]
        if entry.borrowed:
            self._unlink(entry)
        else:
            tier.drop(self._unlink(entry))

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

    def _move_down(self, entry: _Entry, keep: set[str]) -> None:
        src = entry.tier
        for j in range(src + 1, len(self.tiers)):
            if self._make_room(j, entry.size, keep=keep | {entry.uri}):
                self._move(entry, j)
                return
        self.accounting[entry.scope, self.tiers[src].name].evictions += 1
        self._remove(entry)

    def _promote(self, entry: _Entry, target: int) -> None:
        if entry.tier <= target:
            return
        for j in range(target, entry.tier):
            if self._make_room(j, entry.size, keep={entry.uri}):
                self._move(entry, j)
                return

    def _move(self, entry: _Entry, j: int) -> None:
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
            new = dst.write(entry.uri, data)
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

