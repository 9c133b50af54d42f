"""Networked tier on Mooncake Store: objects kept in memory that MLC nodes lend the store
(their segments), placed by a ``mooncake_master`` and moved over its TCP transfer engine.

With ``replicas`` > 1 the master keeps each object in as many segments, so an object outlives
the host that wrote it while another lender is up (docs/mlc.md, "Mooncake Store"). Objects are
values under ``<prefix><uri>``; instances sharing a master and prefix see each other's objects
(``probe``), as they do on the Redis tier.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from dataclasses import dataclass
from typing import Any

from sdcp_fast.cache.failures import CacheFull
from sdcp_fast.cache.tiers.tier import TierUnreachable, as_bytes_view

__all__ = ["MooncakeConfig", "MooncakeTier", "TierUnreachable"]

MiB = 1 << 20
# Mooncake's ErrorCode values that mean something to the tier (mooncake-store/include/types.h).
_NO_SPACE = -200  # no segment has room for it
_NOT_FOUND = -704
_RPC = range(-999, -899)  # RPC_FAIL, RPC_TIMEOUT, ...: the master did not answer
_HAS_LEASE = -706  # read within the master's --default_kv_lease_ttl: removable once it lapses
# Drops the master refused for a read lease wait for a later flush; beyond this many the
# oldest are forgotten (the master's own eviction reclaims them).
MAX_PENDING_DROPS = 4096
SETUP_PROBE_S = 5.0
# After the master failed to answer, calls fail at once for this long: each try holds the
# MLC's lock for up to the RPC timeout, and a cut-off master would stall every call on the host.
RETRY_AFTER_S = 5.0
# How long a tier built with ``attach_later`` waits for the master's port on each try: it holds
# the MLC's lock, and a master whose host is down does not refuse, it is silent.
ATTACH_PROBE_S = 1.0

log = logging.getLogger("sdcp_fast.cache")


@dataclass(frozen=True)
class MooncakeConfig:
    """Where the store is and what this node lends it.

    ``master``: the master's RPC address, ``host:port``. ``metadata``: the transfer engine's
    metadata service: ``http://host:port/metadata`` (the master's own, with
    ``--enable_http_metadata_server``), an ``etcd://`` address or ``P2PHANDSHAKE``.
    ``segment_bytes``: memory this node lends the store (0: it only reads and writes).
    ``buffer_bytes``: the client's transfer buffer; larger objects are registered in place.
    ``hostname``: the address other nodes reach this one at (default: this machine's address
    on the route to the master). ``rpc_timeout_ms``: how long a call waits for the master
    (the client's ``MC_RPC_TIMEOUT_MS``, 30 s by default, for the whole process; an
    ``MC_RPC_TIMEOUT_MS`` already in the environment wins). ``attach_later``: with no master
    answering, the tier is built without one, every call answers TierUnreachable, and one call
    every ``RETRY_AFTER_S`` at most tries to set the client up (a cluster node that starts while
    the master's host is down serves without the tier until it answers)."""

    master: str
    metadata: str
    segment_bytes: int = 512 * MiB
    buffer_bytes: int = 64 * MiB
    replicas: int = 2
    hostname: str | None = None
    protocol: str = "tcp"
    rpc_timeout_ms: int = 2000
    attach_later: bool = False

    def master_address(self) -> tuple[str, int]:
        host, _, port = self.master.rpartition(":")
        return host.strip("[]") or "127.0.0.1", int(port or 50051)

    def local_address(self) -> str:
        if self.hostname:
            return self.hostname
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(self.master_address())  # sends nothing
            return str(s.getsockname()[0])


class MooncakeTier:
    host_readable = True
    outlives_host = True  # objects that must survive their writer's host are placed here

    def __init__(self, capacity: int, config: MooncakeConfig, *, prefix: str = "mlc:", name: str = "mooncake") -> None:
        self.name = name
        self.capacity = capacity
        self.prefix = prefix
        self.config = config
        self._s: Any = None
        self._replicate: Any = None
        self._pending: list[str] = []
        self._down_until = 0.0
        if not config.attach_later:
            self._attach(SETUP_PROBE_S)
        elif not self._try_attach():
            log.warning("Mooncake Store: no master answers at %s; serving without the tier, trying again "
                        "every %g s", config.master, RETRY_AFTER_S)

    def _attach(self, probe_s: float) -> None:
        try:
            # The client's setup retries an absent master for about 90 s before it gives up.
            socket.create_connection(self.config.master_address(), timeout=probe_s).close()
        except OSError as exc:
            raise TierUnreachable(f"no Mooncake master answers at {self.config.master}: {exc}") from None
        os.environ.setdefault("MC_RPC_TIMEOUT_MS", str(self.config.rpc_timeout_ms))
        from mooncake.store import MooncakeDistributedStore, ReplicateConfig

        store = MooncakeDistributedStore()
        config = self.config
        rc = store.setup(config.local_address(), config.metadata, config.segment_bytes, config.buffer_bytes,
                         config.protocol, "", config.master)
        if rc != 0:
            raise TierUnreachable(f"Mooncake Store at {config.master} (metadata {config.metadata}) refused "
                                  f"the client: setup returned {rc}")
        replicate = ReplicateConfig()
        replicate.replica_num = config.replicas
        self._s, self._replicate = store, replicate

    def _try_attach(self) -> bool:
        """Set the client up if the master answers; otherwise the next try waits RETRY_AFTER_S."""
        try:
            self._attach(ATTACH_PROBE_S)
        except TierUnreachable as exc:
            self._down_until = time.monotonic() + RETRY_AFTER_S
            log.debug("%s", exc)
            return False
        return True

    def _failed(self, what: str, rc: int) -> CacheFull | TierUnreachable:
        if rc == _NO_SPACE:
            return CacheFull(f"Mooncake Store's segments have no room: {what} returned {rc}")
        if rc in _RPC:
            self._down_until = time.monotonic() + RETRY_AFTER_S
        return TierUnreachable(f"Mooncake Store at {self.config.master}: {what} returned {rc}")

    def _up(self) -> bool:
        return time.monotonic() >= self._down_until

    def _check_up(self) -> None:
        if not self._up():
            raise TierUnreachable(f"Mooncake Store at {self.config.master} did not answer; "
                                  f"the next try is at most {RETRY_AFTER_S:g} s after that")
        if self._s is None:
            if not self._try_attach():
                raise TierUnreachable(f"no Mooncake master answers at {self.config.master}; "
                                      f"the next try is at most {RETRY_AFTER_S:g} s after this one")
            log.warning("Mooncake Store: attached to the master at %s", self.config.master)

    def write(self, key: str, data: Any) -> str:
        name = self.prefix + key
        if name in self._pending:
            self._pending.remove(name)  # replaced, not dropped: the upsert below takes its place
        view = as_bytes_view(data)
        if not view.nbytes:
            raise CacheFull("Mooncake Store holds no empty objects")
        self._check_up()
        if view.nbytes <= self.config.buffer_bytes // 2:
            rc = self._s.upsert(name, view, self._replicate)  # through the client's buffer
        else:
            rc = self._in_place(view, lambda ptr: self._s.upsert_from(name, ptr, view.nbytes, self._replicate))
        if rc != 0:
            raise self._failed(f"upsert of {view.nbytes} bytes", rc)
        return name

    def _in_place(self, view: memoryview, op: Any) -> int:
        """``op(address)`` with ``view``'s memory registered with the transfer engine."""
        import numpy as np

        ptr = int(np.frombuffer(view, dtype=np.uint8).ctypes.data)
        rc = self._s.register_buffer(ptr, view.nbytes)
        if rc != 0:
            raise self._failed("register_buffer", rc)
        try:
            return int(op(ptr))
        finally:
            self._s.unregister_buffer(ptr)

    def _size(self, name: str) -> int | None:
        self._check_up()
        size = int(self._s.get_size(name))
        if size == _NOT_FOUND:
            return None
        if size < 0:
            raise self._failed(f"get_size of {name}", size)
        return size

    def read(self, handle: str) -> memoryview:
        size = self._size(handle)
        if size is None:
            raise KeyError(handle)
        if size <= self.config.buffer_bytes // 2:
            value = self._s.get(handle)  # b"" on any failure
            if len(value) == size:
                return memoryview(value)
        else:
            out = bytearray(size)
            if self._in_place(memoryview(out), lambda ptr: self._s.get_into(handle, ptr, size)) == size:
                return memoryview(out)
        if self._size(handle) is None:  # deleted between the two calls
            raise KeyError(handle)
        raise self._failed(f"get of {handle} ({size} bytes)", -1)

    def read_range(self, handle: str, start: int, stop: int) -> memoryview:
        if stop <= start:
            return memoryview(b"")
        return self.read(handle)[start:stop]  # the store reads whole objects

    def probe(self, key: str) -> int | None:
        """Size of an object another instance left here, or None."""
        return self._size(self.prefix + key)

    def drop(self, handle: str) -> None:
        self._pending.append(handle)

    def flush(self) -> None:
        """Send deferred drops. One read within the master's read lease is refused (the
        reader may still be copying it) and stays pending for a later flush, as does every
        drop while the master does not answer: a drop it cannot take is no caller's failure,
        and must not fail the calls on this host's other tiers that flush first."""
        if not self._pending or not self._up() or self._s is None:
            return
        kept = []
        for n, name in enumerate(self._pending):
            rc = int(self._s.remove(name))
            if rc == _HAS_LEASE:
                kept.append(name)
            elif rc not in (0, _NOT_FOUND):
                self._failed(f"remove of {name}", rc)
                kept += self._pending[n:]
                break
        self._pending = kept[-MAX_PENDING_DROPS:]

    def close(self) -> None:
        if self._s is None:
            return
        self.flush()
        self._s.close()
