"""Objects of an ``sdcp-fast mlc`` node on this host through its shared memory
(:mod:`sdcp_fast.cache.tiers.shm`): a put writes the bytes once into a file of the node's folder
and sends only their name; a get maps the object's slot and reads it in place. No object byte
crosses TLS or passes through Python. A get first maps the slot linked under the object's name
(no request at all) and asks the node only when that slot is missing, freed, of another name or
past its birth lease's deadline. A drafter's q rows take one slot per session instead, put at
its first round and rewritten in place each round after (:class:`Rolling`, no request), which
readers map once and read in place under its seqlock (:class:`RowsMap`, :func:`rows_guard`).

The requests themselves are the ordinary ones (:mod:`sdcp_fast.mlc_server.server_shm`), so
authorization, leases and accounting are the node's as for any client. The path is taken only
when the node says where its folder is and this process reads the node's token there (the same
host, the same user), and only for a round's draft objects (``KINDS``); otherwise, and for
objects under ``MIN_BYTES`` or with metadata (tensors),
:class:`~sdcp_fast.store.remote_store.RemoteStore` sends the bytes over the network.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import mmap
import os
import re
import secrets
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any

from sdcp_fast.cache.failures import ObjectUnavailable
from sdcp_fast.cache.http_client import MLCUnreachable, problem_of
from sdcp_fast.cache.index import Stored
from sdcp_fast.cache.tiers.shm import (
    ASK,
    DEADLINE_AT,
    HEAD_SIZE,
    HEADER,
    KEPT_AT,
    LIVE,
    MAGIC,
    NAMED_END,
    NAMES,
    RECYCLABLE,
    SERIAL,
    SLOT,
    STATE_AT,
    attach,
    name_digest,
    read_header,
    read_named,
    read_round,
    read_seq,
    rows_round,
    rows_slot,
    write_round,
    write_seq,
)
from sdcp_fast.cache.tiers.tier import as_bytes_view
from sdcp_fast.cache.uri import SCHEME, check_key, parse
from sdcp_fast.protocol.cbor import decode, deterministic_cbor
from sdcp_fast.protocol.problems import BadRequest, SdcpProblem
from sdcp_fast.transport.base import Response, Transport
from sdcp_fast.transport.errors import TransportError

# Below this an object goes over the network: a file, a rename and a mapping cost more than
# sending a few pages. SDCP_SHM_MIN_BYTES sets another bound (a huge one turns the path off).
MIN_BYTES = int(os.environ.get("SDCP_SHM_MIN_BYTES", 64 << 10))
# Above this the write into the folder leaves the event loop.
INLINE_WRITE = 4 << 20
# The draft objects of a round: written once, read by the verifier, dropped at the verdict.
# Other kinds (records rewritten in place, tokens) stay on the network path.
KINDS = frozenset({"q_rows", "draft_kv"})
# A lease let go of (release_later) rides on this client's next put to the node, or is
# released on its own after SPENT_WAIT seconds if no put comes first.
SPENT_WAIT = 0.05
# A session's slot (Rolling) waits longer for a put to ride on: sessions end seconds apart
# on a drafter, the next session's first put usually comes within this.
SLOT_WAIT = 1.0
MAX_SPENT = 64  # the node's bound on the leases one put releases
# Files a writer keeps to write its next objects into once the node has freed them (the pages
# stay: none allocated or freed per round), and how many of the oldest a put looks at.
KEEP = int(os.environ.get("SDCP_SHM_KEEP", 256))
LOOK = 4
# Times a get asks again for an object whose slot was freed between the node's answer and the
# mapping (an object rewritten that often meanwhile is reported missing).
ASKS = 3
_SLOT_NAME = re.compile(r"slot-\d{1,20}")
# A writer's rewritten slot (:class:`Rolling`) is renewed once this share of its lease has
# passed, and given up (a new one leased) this many seconds before the lease ends.
RENEW_AT = 0.5
EXPIRY_MARGIN = 1.0
# Rewritten slots a reader keeps mapped; every SWEEP reads it drops those freed meanwhile (a
# mapping keeps an unlinked file's pages).
MAPS = 4096
SWEEP = 256


def after_map() -> None:
    """Called between a slot's mapping and its check (tests free the slot here)."""


def write_upload(path: str, data: memoryview) -> None:
    """``data`` after a header page in a new file ``path``: the one copy of its bytes."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        _write_at(fd, data)
    finally:
        os.close(fd)


def _write_at(fd: int, data: memoryview) -> None:
    done = 0
    while done < data.nbytes:
        done += os.pwrite(fd, data[done:], HEADER + done)


class Kept:
    """A file a writer keeps in the node's folder (``w-<pid>-<token>``), open for writing: the
    upload of one object at a time, written again only once the node set it RECYCLABLE."""

    __slots__ = ("fd", "path", "size")

    def __init__(self, folder: str) -> None:
        self.path = os.path.join(folder, f"w-{os.getpid()}-{secrets.token_hex(16)}")
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        self.size = 0

    def recyclable(self) -> bool:
        return os.pread(self.fd, 1, STATE_AT) == bytes([RECYCLABLE])

    def write(self, data: memoryview) -> None:
        if self.size != data.nbytes:
            os.ftruncate(self.fd, HEADER + data.nbytes)
            self.size = data.nbytes
        _write_at(self.fd, data)

    def close(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        os.close(self.fd)


class Rolling:
    """A slot a writer leased once for one session's q rows (named by :func:`rows_slot`) and
    rewrites in place each round, mapped writable; its lease is renewed as rounds go on and
    released when the session ends, so a steady round sends the node nothing."""

    __slots__ = ("expires", "lease", "mm", "renew_at", "seq", "size")

    def __init__(self, mm: mmap.mmap, size: int) -> None:
        self.mm, self.size = mm, size
        self.seq = 0
        self.lease = ""
        self.renew_at = self.expires = 0.0

    def leased(self, lease: str, since: float, ttl: float) -> None:
        """Held under ``lease`` from ``since`` (the clock read before the request)."""
        self.lease = lease
        self.renew_at, self.expires = since + RENEW_AT * ttl, since + ttl - EXPIRY_MARGIN

    def live(self) -> bool:
        return self.mm[STATE_AT] == LIVE

    def write(self, data: memoryview, round_: int, digest: bytes) -> None:
        """The round's rows, under the seqlock: a reader that checks the sequence number
        before and after it used them never takes bytes of two rounds (or of none)."""
        mm, seq = self.mm, self.seq + 1
        write_seq(mm, seq)  # odd: being written
        mm[HEADER: HEADER + data.nbytes] = data
        write_round(mm, round_, data.nbytes, digest)
        self.seq = seq + 1
        write_seq(mm, seq + 1)

    def close(self) -> None:
        self.mm.close()


class RowsMap(mmap.mmap):
    """A reader's mapping of a rewritten slot; ``seen``: the sequence number and name digest
    of the round last read from it (:func:`rows_guard`)."""

    seen: tuple[int, bytes] = (0, b"")

    def round_view(self, digest: bytes) -> memoryview | None:
        """The rows of the round whose object name has ``digest``, if the slot is LIVE, within
        its lease's deadline and holds that round, written whole; else None."""
        magic, _, size, state = read_header(self)
        if magic != MAGIC or state != LIVE:
            return None
        deadline = read_named(self)[1]
        if deadline and time.monotonic_ns() >= deadline:
            return None
        seq = read_seq(self)
        _, length, held = read_round(self)
        if seq & 1 or not seq or held != digest or not 0 < length <= size:
            return None
        self.seen = (seq, digest)
        return memoryview(self)[HEADER: HEADER + length]

    def holds(self, seq: int, digest: bytes) -> bool:
        """Whether the slot is LIVE and still holds the round read under ``seq``."""
        return self[STATE_AT] == LIVE and read_seq(self) == seq and read_round(self)[2] == digest


def rows_guard(view: memoryview) -> Callable[[], bool] | None:
    """For rows read in place from a rewritten slot: a check, to call once they have been used,
    that they were not rewritten (nor freed) meanwhile; None for other views (their bytes are
    final). Call it right after the read, before the event loop runs another."""
    mm = view.obj
    if type(mm) is not RowsMap:
        return None
    seq, digest = mm.seen
    return lambda: mm.holds(seq, digest)


def _quiet_torch() -> None:
    """torch warns, once a process, that a tensor over a read-only buffer would not protect
    it; these rows' readers only read them (the verifier's kernels): spent quietly here, once."""
    global _QUIET
    torch = sys.modules.get("torch")
    if _QUIET or torch is None:
        return
    _QUIET = True
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        torch.frombuffer(b"\0", dtype=torch.uint8)


_QUIET = False


def _map_rows(path: str) -> RowsMap | None:
    _quiet_torch()
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        size = os.fstat(fd).st_size
        if size <= HEADER:
            return None
        # Populated now: a reader then touches no page fault. On a GPU host this mapping is
        # what would be registered as pinned (cudaHostRegister) and copied to the device with
        # non_blocking=True, the check after the copy.
        return RowsMap(fd, size, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE, prot=mmap.PROT_READ)
    finally:
        os.close(fd)


def _new_rolling(path: str, size: int) -> Rolling:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        os.ftruncate(fd, HEADER + size)
        mm = mmap.mmap(fd, HEADER + size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)
    return Rolling(mm, size)


def _read(fd: int, *, serial: int | None = None, size: int | None = None,
          digest: bytes | None = None) -> memoryview | None:
    """The bytes of the slot open as ``fd`` if its header says LIVE (and the ``serial``, ``size``
    and name ``digest`` asked for, and a deadline not passed), else None. Mapped read-only and
    populated, checked after the mapping; a KEPT slot (its writer may rewrite the file once it
    is freed) is copied instead, and checked again after the copy."""
    st = os.fstat(fd).st_size - HEADER
    head = os.pread(fd, NAMED_END, 0)
    if len(head) < NAMED_END:
        return None
    magic, got, stored, state = read_header(head)
    named, deadline = read_named(head)
    if (magic != MAGIC or state != LIVE or stored > st or (serial is not None and got != serial)
            or (size is not None and stored != size) or (digest is not None and named != digest)
            or (deadline and time.monotonic_ns() >= deadline)):
        return None
    if head[KEPT_AT]:
        copy = bytearray(stored)
        if os.preadv(fd, [copy], HEADER) != stored:
            return None
        after_map()
        again = os.pread(fd, HEAD_SIZE, 0)
        return memoryview(copy) if read_header(again) == (MAGIC, got, stored, LIVE) else None
    # Populated now: a reader then touches no page fault. On a GPU host this mapping is what
    # would be registered as pinned (cudaHostRegister) and copied to the device with
    # non_blocking=True; this machine has no GPU, so the path stops at the host view.
    _quiet_torch()
    mm = mmap.mmap(fd, HEADER + stored, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE, prot=mmap.PROT_READ)
    after_map()
    if read_header(mm) != (MAGIC, got, stored, LIVE):
        mm.close()
        return None
    return memoryview(mm)[HEADER:]


def map_slot(folder: str, name: str, serial: int, size: int) -> memoryview:
    """The slot's bytes (:func:`_read`); ObjectUnavailable if it was freed (or replaced)
    before the check that follows the mapping. Freed later, the view still shows these bytes:
    the node never writes a slot's data, a new object is a new file, and a slot its writer may
    rewrite is read as a copy."""
    gone = ObjectUnavailable(f"slot {name} of the node's shared memory was freed")
    if not _SLOT_NAME.fullmatch(name) or size < 1:
        raise BadRequest(f"the node named no slot: {name!r}, {size} bytes")
    try:
        fd = os.open(os.path.join(folder, name), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        raise gone from None
    try:
        view = _read(fd, serial=serial, size=size)
    finally:
        os.close(fd)
    if view is None:
        raise gone
    return view


def map_named(folder: str, uri: str) -> memoryview | None:
    """The bytes of ``uri``'s slot found by its name (:func:`_read`), if the header says it is
    that object's, LIVE and within its birth lease; None otherwise (the caller asks the node,
    which knows whether the object is elsewhere or gone). Never another object's bytes: a
    name's file is replaced, never rewritten, and the node frees a slot (FREED) before it
    unlinks it."""
    digest = name_digest(uri)
    try:
        fd = os.open(os.path.join(folder + NAMES, digest.hex()), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return _read(fd, digest=digest)
    finally:
        os.close(fd)


def _drafted(uri: str) -> bool:
    try:
        return parse(uri).kind in KINDS
    except ValueError:
        return False


def _path(uri: str) -> str:
    check_key(uri)
    if not uri.startswith(SCHEME):
        raise ValueError(f"remote MLC objects are mlc:// URIs: {uri!r}")
    return "objects/" + uri[len(SCHEME):]


class ShmClient:
    """The same-host path to the node at ``base_url`` (reached on ``transport`` for the
    requests): :meth:`put` and :meth:`get` return None where it does not apply."""

    def __init__(self, base_url: str, transport: Transport) -> None:
        self.base_url = base_url.rstrip("/") + "/"
        self.transport = transport
        self.folder: str | None = None
        self._known = False  # whether the node was asked (and answered) where its folder is
        self._spent: list[str] = []  # leases to release with drop, with the next put
        self._flush: asyncio.TimerHandle | None = None
        self._flushing: set[asyncio.Task[None]] = set()
        # Whether puts keep their files to write later objects into (a writer of one object
        # after another, e.g. a drafter's q rows); their readers then get copies, checked.
        self.keep = False
        self._kept: collections.deque[Kept] = collections.deque()  # oldest first
        self._keeping = 0  # kept files, in the deque or in a put
        # Whether q rows go into one slot per session rewritten each round (:class:`Rolling`),
        # leased once: a drafter's. Its slots by name; a reader's mappings by the name's digest.
        self.rolling = False
        self._rolls: dict[str, Rolling] = {}
        self._maps: dict[str, RowsMap] = {}
        self._reads = 0
        self._refused: dict[str, float] = {}  # slot names the node would not take, until when

    async def _call(self, method: str, path: str, *, headers: dict[str, str] | None = None,
                    query: dict[str, str] | None = None, body: bytes = b"") -> Response:
        try:
            response = await self.transport.request(self.base_url, method, path, body=body, query=query,
                                                     headers=headers)
        except TransportError as exc:
            raise MLCUnreachable(str(exc)) from exc
        if response.status >= 400:
            raise problem_of(response)
        return response

    async def usable(self) -> bool:
        """Whether the node's folder is reachable from here; asked once per node instance."""
        if not self._known:
            try:
                doc = decode((await self._call("GET", "shm")).body)
            except MLCUnreachable:
                return False  # asked again once it answers
            except Exception:  # no such route or no folder: an older or a network-only node
                doc = None
            self._known = True
            ok = isinstance(doc, dict) and isinstance(doc.get("folder"), str) and isinstance(doc.get("token"), str)
            self.folder = doc["folder"] if ok and attach(doc["folder"], doc["token"]) else None
        return self.folder is not None

    def forget(self) -> None:
        """The node lost our upload (restarted with another folder): ask it again next time."""
        self._known, self.folder = False, None
        while self._kept:
            self._drop(self._kept.popleft())
        for roll in self._rolls.values():
            roll.close()
        self._rolls.clear()
        self._maps.clear()

    def _drop(self, kept: Kept) -> None:
        self._keeping -= 1
        kept.close()

    def _take(self, folder: str) -> Kept | None:
        """A kept file to write the next object into: one of the oldest ``LOOK`` that the node
        has freed, else a new one while fewer than ``KEEP`` are kept; None past that."""
        for _ in range(min(LOOK, len(self._kept))):
            kept = self._kept.popleft()
            if kept.recyclable():
                return kept
            self._kept.append(kept)  # still an object (or freed while a response viewed it)
        if self._keeping >= KEEP:
            return None
        self._keeping += 1
        return Kept(folder)

    def release_later(self, lease: str, wait: float | None = None) -> bool:
        """Take ``lease`` to release with drop (as :meth:`RemoteStore.release`) with the next put
        to the node, sparing a request a round; False when this client puts nothing through
        the node's folder (the caller releases it itself). Released within ``wait`` s
        (``SPENT_WAIT``)."""
        if self.folder is None:
            return False
        self._spent.append(lease)
        loop = asyncio.get_running_loop()
        due = loop.time() + (SPENT_WAIT if wait is None else wait)
        if self._flush is None or self._flush.when() > due:
            if self._flush is not None:
                self._flush.cancel()
            self._flush = loop.call_at(due, self._flush_spent)
        return True

    def _flush_spent(self) -> None:
        """The leases no put took in time, released one request each."""
        self._flush = None
        spent, self._spent = self._spent, []
        for lease in spent:
            task = asyncio.ensure_future(self._release(lease))
            self._flushing.add(task)
            task.add_done_callback(self._flushing.discard)

    async def _release(self, lease: str) -> None:
        with contextlib.suppress(Exception):  # as a drafter's own release: expired or gone is done
            await self._call("DELETE", "leases/" + lease, query={"drop": "1"})

    async def put(self, uri: str, data: Any, lease_ttl: float | None = None) -> Stored | None:
        rows = rows_round(uri)
        # A tensor carries its dtype and shape: not through here.
        if hasattr(data, "untyped_storage") or (rows is None and not _drafted(uri)):
            return None
        view = as_bytes_view(data)
        if view.nbytes < max(1, MIN_BYTES) or not await self.usable():
            return None
        assert self.folder is not None
        if self.rolling and rows is not None and lease_ttl is not None and view.nbytes <= INLINE_WRITE:
            if (rolled := await self._roll(uri, *rows, view, lease_ttl)) is not None:
                return rolled
        upload = os.path.join(self.folder, "up-" + secrets.token_hex(16))
        query = {"shm": os.path.basename(upload)[3:]}
        kept = self._take(self.folder) if self.keep and view.nbytes <= INLINE_WRITE else None
        if lease_ttl is not None:
            query["lease_ms"] = str(max(1, round(lease_ttl * 1000)))
        spent, self._spent = self._spent[:MAX_SPENT], self._spent[MAX_SPENT:]
        if spent:
            query["release"] = ",".join(spent)
        stored: Stored | None = None
        try:
            try:
                if kept is not None:
                    kept.write(view)
                    os.link(kept.path, upload)
                elif view.nbytes <= INLINE_WRITE:
                    write_upload(upload, view)
                else:
                    await asyncio.to_thread(write_upload, upload, view)
            except OSError:
                self.forget()
                return None
            try:
                doc = decode((await self._call("PUT", _path(uri), query=query)).body)
            except BadRequest:
                self.forget()  # it did not find the upload: the bytes go over the network
                return None
            stored = Stored(doc["etag"], doc["tier"], doc.get("lease"))
            return stored
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(upload)  # gone already when the node took it
            if kept is not None:
                # Taken by the node, it is written again once the node frees it; else let go.
                if stored is not None:
                    self._kept.append(kept)
                else:
                    self._drop(kept)
            if stored is None and spent:  # not taken: released on their own
                self._spent[:0] = spent
                if self._flush is None:
                    self._flush = asyncio.get_running_loop().call_later(SPENT_WAIT, self._flush_spent)

    async def _roll(self, uri: str, slot: str, round_: int, view: memoryview, ttl: float) -> Stored | None:
        """``uri``'s rows written into the session's slot ``slot``: in place, with no request,
        while the slot is LIVE, large enough and its lease not near its end (renewed past
        ``RENEW_AT`` of it); else into a new slot, put under a lease of ``ttl`` s (the old one
        let go of). The lease is the slot's, released by :meth:`end_rows`, not the round's:
        the Stored has none. None when the node would not take the slot (the caller puts the
        round as an object of its own)."""
        roll = self._rolls.get(slot)
        now_ns = time.monotonic_ns()
        now = now_ns / 1e9
        if self._refused and roll is None and self._refused.get(slot, 0.0) > now:
            return None
        if roll is not None and (roll.size < view.nbytes or now >= roll.expires or not roll.live()):
            live = roll.live()
            del self._rolls[slot]
            roll.close()
            if live:  # released first: the node takes no new slot under a name still leased
                await self._release(roll.lease)
            roll = None
        if roll is not None and now >= roll.renew_at:
            try:
                await self._call("PUT", "leases/" + roll.lease, body=deterministic_cbor({"ttl_ms": round(ttl * 1000)}),
                                 headers={"content-type": "application/cbor"})
            except Exception:  # expired or the node is gone: a new slot, or the network path
                self.end_rows(uri)
                roll = None
            else:
                roll.leased(roll.lease, now, ttl)
                # Readers by name stop trusting the slot no later than the node's expiry: the
                # deadline counts from before the renewal.
                roll.mm[DEADLINE_AT: DEADLINE_AT + 8] = (now_ns + int(ttl * 1e9)).to_bytes(8, "little")
        digest = name_digest(uri)
        if roll is not None and not roll.mm.closed:  # (closed by forget() during the renewal)
            roll.write(view, round_, digest)
            return Stored("", "host", None)
        assert self.folder is not None
        token = secrets.token_hex(16)
        upload = os.path.join(self.folder, "up-" + token)
        query = {"shm": token, "lease_ms": str(max(1, round(ttl * 1000)))}
        spent, self._spent = self._spent[:MAX_SPENT], self._spent[MAX_SPENT:]
        if spent:
            query["release"] = ",".join(spent)
        try:
            roll = _new_rolling(upload, view.nbytes)
            roll.write(view, round_, digest)
        except OSError:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(upload)
            self._spent[:0] = spent
            self.forget()
            return None
        stored: Stored | None = None
        try:
            doc = decode((await self._call("PUT", _path(slot), query=query)).body)
            stored = Stored(doc["etag"], doc["tier"], None)
            roll.leased(doc["lease"], now, ttl)
            self._rolls[slot] = roll
            return stored
        except BadRequest:
            self.forget()  # it did not find the upload: the bytes go over the network
            return None
        except SdcpProblem:
            # The name is held (a predecessor of ours under the same tag, dead or not, whose
            # lease has not run out): its rounds go as objects of their own until that lease
            # could have ended.
            if len(self._refused) >= MAPS:
                self._refused = {k: t for k, t in self._refused.items() if t > now}
            self._refused[slot] = now + ttl
            return None
        finally:
            if stored is None:
                roll.close()
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(upload)
                if spent:
                    self._spent[:0] = spent
                    if self._flush is None:
                        self._flush = asyncio.get_running_loop().call_later(SPENT_WAIT, self._flush_spent)

    def end_rows(self, uri: str) -> None:
        """The session of the q rows ``uri`` names is over here: its slot's lease released
        with drop (with a put within ``SLOT_WAIT`` s, :meth:`release_later`), the slot unmapped."""
        slot = rows_slot(uri)
        roll = self._rolls.pop(slot, None) if slot is not None else None
        if roll is not None:
            roll.close()
            self.release_later(roll.lease, SLOT_WAIT)

    def _in_place(self, uri: str, slot: str) -> memoryview | None:
        """``uri``'s rows read in place from the writer's rewritten ``slot``, found by name
        (no request) and kept mapped; None when it does not hold that round (or is gone)."""
        folder = self.folder
        assert folder is not None
        key, digest = slot, name_digest(uri)
        self._reads += 1
        if self._reads % SWEEP == 0:
            self._maps = {k: m for k, m in self._maps.items() if m[STATE_AT] == LIVE}
        mm = self._maps.get(key)
        if mm is not None and (view := mm.round_view(digest)) is not None:
            return view
        # Not mapped yet, or the mapping is of a slot freed since (the session's next lease
        # is another file under the same name): mapped again.
        self._maps.pop(key, None)
        mm = _map_rows(os.path.join(folder + NAMES, name_digest(slot).hex()))
        if mm is None:
            return None
        if len(self._maps) >= MAPS:
            del self._maps[next(iter(self._maps))]
        self._maps[key] = mm
        return mm.round_view(digest)

    def in_place(self, uri: str) -> memoryview | None:
        """One round's q rows read in place from its writer's session slot, with no await
        (a caller that must not yield, :func:`rows_guard` to check them after use); None when
        the node's folder is not known yet or the slot does not hold that round whole (then
        :meth:`get` says whether the rows are elsewhere or gone)."""
        rows = rows_round(uri)
        if rows is None or self.folder is None:
            return None
        return self._in_place(uri, rows[0])

    async def get(self, uri: str) -> memoryview | None:
        """The object, mapped in place if the node keeps it in a slot; its bytes as sent
        otherwise. None when the path does not apply (the caller sends an ordinary get)."""
        rows = rows_round(uri)
        if (rows is None and not _drafted(uri)) or not await self.usable():
            return None
        folder = self.folder
        assert folder is not None
        if rows is not None and (view := self._in_place(uri, rows[0])) is not None:
            return view
        if (view := map_named(folder, uri)) is not None:
            return view
        for attempt in range(1, ASKS + 1):
            out = await self._call("GET", _path(uri), headers={ASK: "1"})
            slot = out.headers.get(SLOT)
            if slot is None:
                return memoryview(out.body)
            try:
                return map_slot(folder, slot, int(out.headers.get(SERIAL, "0")), int(out.headers.get("mlc-size", "0")))
            except ObjectUnavailable:
                # Freed since the node named it: the object was replaced (a record rewritten)
                # or is gone, and the node's next answer says which.
                if attempt == ASKS:
                    raise
        raise AssertionError("unreachable")
