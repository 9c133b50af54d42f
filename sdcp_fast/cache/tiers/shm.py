"""The host tier with a part in shared memory: objects a client on the same host wrote
straight into a file of this node's folder in ``/dev/shm`` are kept there, one file per
object, and readers on the host map them instead of receiving their bytes.

A slot's life (docs/mlc.md, "Same-host objects in shared memory"):

1. The writer creates ``up-<token>`` (128 random bits) in the node's folder and writes the
   object after a header page, in one ``pwrite``: the only copy of its bytes.
2. Its put (over the network, authorized as any put) names the token; :meth:`ShmTier.write`
   renames the file to ``slot-<serial>`` and writes the header (magic, serial, size, state
   LIVE). The slot is an object of the cache like any other: leases, writer tags, LRU and scope
   accounting are the index's, unchanged.
3. The slot is also linked under its object's name in the names folder (``<folder>.names/``,
   the name's digest): a reader on the host maps that file without asking the node, and takes
   its bytes only if the header, checked after mapping, is LIVE, names the same digest and its
   birth lease has not run out (``deadline``, ``CLOCK_MONOTONIC``, set before the index's own
   expiry). Otherwise it asks for the object as usual; the node answers the slot's name and
   serial instead of its bytes, and the reader maps the file read-only and checks the header
   after mapping (:mod:`sdcp_fast.store.shm_client`).
4. When the index drops the object (its lease released with ``drop`` or expired, even if its
   writer died; deleted, evicted, moved to another tier) the header is set FREED and both names
   unlinked: a reader that opens it later gets ENOENT, one that mapped it before gets FREED at
   its check. Either is the missing object's error (the name path then asks the node, which
   says whether the object is elsewhere or gone).

The node never reuses a slot and writes a slot's header only, never its bytes: a new object is
a new file (a new inode), so a mapping made before a free keeps showing the bytes of its own
object, never another round's. The one exception is a writer's kept file: a writer may keep a
link of its own to an upload (``w-<pid>-<token>``) so that, once the slot is freed, it writes
its next object into the same pages instead of new ones (no page allocated, none freed, per
round). The node marks such a slot KEPT when it adopts it, and sets RECYCLABLE at its free only
when no response of its own still views the bytes; the writer rewrites only a RECYCLABLE file.
A reader of a KEPT slot copies its bytes and checks the header after the copy (serial and
LIVE unchanged), so it never returns bytes written after the free. Other objects (network
puts) are kept by :class:`~sdcp_fast.cache.tiers.host.HostTier` as before.

A drafter's q rows take a slot per session instead (:func:`rows_round`): put once under a
lease, then rewritten in place by its writer each round under a seqlock in the header
(``ROUND_AT``), so a round needs no request. Its readers check the sequence number and the
round's name digest before and after they use the rows
(:class:`~sdcp_fast.store.shm_client.RowsMap`); the node frees it as any slot.

The folder is ``0700``: only processes of the node's user can write or map it, and they are
trusted with each other's slots as they are with each other's memory.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import mmap
import os
import re
import secrets
import shutil
import stat
import struct
import tempfile
import time
from typing import Any

from sdcp_fast.cache.tiers.host import HostTier
from sdcp_fast.cache.uri import local_name
from sdcp_fast.protocol.problems import BadRequest

HEADER = mmap.PAGESIZE  # the data starts on a page: a view of it is aligned for any dtype
MAGIC = b"SDCPSHM1"
# magic, serial, size, state: the header's first 25 bytes
_HEAD = struct.Struct("<8sQQB")
LIVE, FREED, RECYCLABLE = 1, 2, 3  # RECYCLABLE: freed, and its writer may write it again
STATE_AT = 24
KEPT_AT = 25  # 1: its writer keeps a link to the file and may reuse it once RECYCLABLE
# After it: the object name's digest and the birth lease's deadline (monotonic ns, 0: none),
# what a reader that found the slot by name checks.
_NAMED = struct.Struct("<16sQ")
NAMED_AT = 32
NAMED_END = NAMED_AT + _NAMED.size
HEAD_SIZE = _HEAD.size
DEADLINE_AT = NAMED_AT + 16
# A slot its writer rewrites in place round after round (a drafter's q rows, leased once per
# session: :func:`rows_slot`) says which round it holds after the writer's sequence number, a
# seqlock: odd while the writer writes, made even (one aligned 8-byte store) only after the
# rows and the round's fields. Round, length, and the digest of the round's object name
# (scope, session, round and writer tag).
ROUND_AT = 64
_SEQ = struct.Struct("<Q")
_ROUND = struct.Struct("<QQ16s")
ROUND_END = ROUND_AT + _SEQ.size + _ROUND.size
NAMES = ".names"  # the sibling folder of slots linked by name: <folder>.names/<digest>
ID_FILE = "node.id"  # "<token> <pid>": a client is on this host when it reads the same token
UPLOAD = re.compile(r"[0-9a-f]{32}")
FOLDER_PREFIX = "sdcp-mlc-"
# HTTP headers of the node's answers (mlc_server/server_shm.py): a get that asks with ASK is
# answered with the slot's file name and serial instead of the bytes.
ASK, SLOT, SERIAL = "mlc-shm", "mlc-shm-slot", "mlc-shm-serial"
# An upload its writer never put (it died in between) is removed after this many seconds.
ORPHAN_AGE = 60.0


def header(serial: int, size: int, state: int) -> bytes:
    return _HEAD.pack(MAGIC, serial, size, state)


def read_header(buf: Any) -> tuple[bytes, int, int, int]:
    magic, serial, size, state = _HEAD.unpack_from(buf, 0)
    return magic, serial, size, state


def read_named(buf: Any) -> tuple[bytes, int]:
    """The digest of the object's name and its birth lease's deadline (0: none)."""
    digest, deadline = _NAMED.unpack_from(buf, NAMED_AT)
    return digest, deadline


def name_digest(uri: str) -> bytes:
    return hashlib.blake2b(uri.encode(), digest_size=16).digest()


# A plain name of one round's q rows (cache/uri.py), matched in one step: a round's reader and
# writer both ask, every round.
_ROWS = re.compile(r"(mlc://[0-9a-f]{32}/[A-Za-z0-9_\-]{1,64}/q_rows/)([0-9]{1,19})((?:\.[A-Za-z0-9_\-]{1,32})?)")


def rows_round(uri: str) -> tuple[str, int] | None:
    """If ``uri`` is the plain name of one round's q rows: the name of the slot its writer
    keeps for the session's rows (round 0, under the same writer tag) and the round."""
    m = _ROWS.fullmatch(uri)
    if m is None or m[2][0] == "0":  # round 0 is the slot's own; a round has one spelling
        return None
    return m[1] + "0" + m[3], int(m[2])


def rows_slot(uri: str) -> str | None:
    """:func:`rows_round`'s slot name, for a plain name or one naming its node."""
    found = rows_round(local_name(uri))
    return None if found is None else found[0]


def read_seq(buf: Any) -> int:
    seq: int = _SEQ.unpack_from(buf, ROUND_AT)[0]
    return seq


def write_seq(buf: Any, seq: int) -> None:
    _SEQ.pack_into(buf, ROUND_AT, seq)


def read_round(buf: Any) -> tuple[int, int, bytes]:
    """The round a rewritten slot holds, its length in bytes and its object name's digest
    (meaningful only under an even :func:`read_seq` that is the same before and after)."""
    round_, length, digest = _ROUND.unpack_from(buf, ROUND_AT + _SEQ.size)
    return round_, length, digest


def write_round(buf: Any, round_: int, length: int, digest: bytes) -> None:
    _ROUND.pack_into(buf, ROUND_AT + _SEQ.size, round_, length, digest)


class ShmUpload(mmap.mmap):
    """The bytes of a writer's upload, mapped read-only (the object's data, after the header
    page); a buffer, so any tier can copy it. ``path`` is the upload's file."""

    path: str
    serial: int = 0  # set once adopted: the slot's number
    deadline: int = 0  # the birth lease's end (time.monotonic_ns), taken before the put's; 0: none

    @classmethod
    def open(cls, folder: str, token: str) -> ShmUpload:
        """The upload ``token`` in ``folder``; BadRequest if there is none (or it is not a
        plain file of at least one byte of data)."""
        if not UPLOAD.fullmatch(token):
            raise BadRequest("shm must be the upload's 32 hexadecimal digits")
        path = os.path.join(folder, "up-" + token)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            raise BadRequest("no such upload in this node's shared memory") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_size <= HEADER:
                raise BadRequest("an upload is a header page and at least one byte of data")
            up = cls(fd, st.st_size - HEADER, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ, offset=HEADER)
        finally:
            os.close(fd)
        up.path = path
        return up


class Slot:
    """An object kept in a file of the shared folder: its data mapping and its header."""

    __slots__ = ("data", "head", "inode", "kept", "link", "name", "path", "serial", "size")

    def __init__(self, data: ShmUpload, head: mmap.mmap, path: str, serial: int, link: str, inode: int) -> None:
        self.data, self.head, self.path, self.serial = data, head, path, serial
        self.link, self.inode = link, inode
        self.kept = bool(head[KEPT_AT])
        self.name = os.path.basename(path)
        self.size = len(data)

    def free(self) -> None:
        """FREED, then unlinked: readers that mapped it fail their check, later ones ENOENT."""
        self.head[STATE_AT] = FREED
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        # The name may be another slot's by now (the object put again): only ours is removed.
        with contextlib.suppress(FileNotFoundError):
            if os.stat(self.link, follow_symlinks=False).st_ino == self.inode:
                os.unlink(self.link)
        try:
            self.data.close()
        except BufferError:  # a response being sent still views it: unmapped with it, never rewritten
            pass
        else:
            if self.kept:
                self.head[STATE_AT] = RECYCLABLE
        self.head.close()


def _dead(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def sweep_dead_nodes(base: str) -> None:
    """Remove the folders that nodes killed before they closed left under ``base``."""
    with contextlib.suppress(OSError):
        for entry in os.scandir(base):
            if not entry.name.startswith(FOLDER_PREFIX) or not entry.is_dir(follow_symlinks=False):
                continue
            try:
                with open(os.path.join(entry.path, ID_FILE)) as f:
                    pid = int(f.read().split()[1])
            except (OSError, ValueError, IndexError):
                continue  # another program's folder, or a node still starting
            if entry.stat(follow_symlinks=False).st_uid == os.getuid() and _dead(pid):
                shutil.rmtree(entry.path, ignore_errors=True)
                shutil.rmtree(entry.path + NAMES, ignore_errors=True)


def _writer_gone(name: str) -> bool:
    """Whether the writer whose kept file is ``w-<pid>-<token>`` is dead."""
    try:
        return _dead(int(name.split("-")[1]))
    except (IndexError, ValueError):
        return True


class ShmTier(HostTier):
    """:class:`HostTier` whose same-host uploads are kept as slots in a folder under ``base``
    (``/dev/shm``: memory, not disk). ``folder`` and ``token`` are what clients are told."""

    def __init__(self, capacity: int, *, base: str = "/dev/shm", name: str = "host",
                 pool_bytes: int | None = None) -> None:
        super().__init__(capacity, name=name, pool_bytes=pool_bytes)
        sweep_dead_nodes(base)
        self.folder = tempfile.mkdtemp(prefix=FOLDER_PREFIX, dir=base)  # mode 0700
        self.names = self.folder + NAMES
        os.mkdir(self.names, 0o700)
        self.token = secrets.token_hex(16)
        with open(os.path.join(self.folder, ID_FILE), "w") as f:
            f.write(f"{self.token} {os.getpid()}\n")
        self._serials = itertools.count(1)
        self.adopted = 0  # uploads kept as slots, ever
        self._swept = time.monotonic()

    def write(self, key: str, data: Any) -> Any:
        if not isinstance(data, ShmUpload):
            return super().write(key, data)
        serial = next(self._serials)
        path = os.path.join(self.folder, f"slot-{serial}")
        try:
            os.rename(data.path, path)
        except FileNotFoundError:
            raise BadRequest("the upload was taken by another put") from None
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            st = os.fstat(fd)
            if st.st_nlink == 1:
                os.fchmod(fd, 0o400)  # its writer's bytes are final
            head = mmap.mmap(fd, HEADER, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        digest = name_digest(key)
        head[NAMED_AT: NAMED_AT + _NAMED.size] = _NAMED.pack(digest, data.deadline)
        head[KEPT_AT] = st.st_nlink > 1  # another link: its writer's, kept to write again once freed
        head[: _HEAD.size] = header(serial, len(data), LIVE)
        link = os.path.join(self.names, digest.hex())
        # A name left by a slot not yet freed (the index drops the old object before the new
        # write, so only a failed free leaves one) is replaced: the link is made, then renamed.
        spare = f"{link}.{serial}"
        os.link(path, spare)
        os.rename(spare, link)
        data.path, data.serial = path, serial
        self.adopted += 1
        self._sweep_orphans()
        return Slot(data, head, path, serial, link, st.st_ino)

    def slot_of(self, view: memoryview) -> tuple[str, int] | None:
        """The slot's file name and serial if ``view`` (from :meth:`read`) shows a whole slot."""
        up = view.obj
        if isinstance(up, ShmUpload) and up.serial and view.nbytes == len(up):
            return os.path.basename(up.path), up.serial
        return None

    def round_of(self, view: memoryview, digest: bytes) -> bytes | None:
        """A copy of the round whose object name has ``digest`` from the rewritten slot
        ``view`` shows (:func:`rows_round`), if it holds that round written whole before and
        after the copy (the writer's seqlock); None otherwise."""
        up = view.obj
        if not isinstance(up, ShmUpload) or not up.serial or view.nbytes != len(up):
            return None
        try:
            fd = os.open(up.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return None  # freed meanwhile
        try:
            before = os.pread(fd, ROUND_END, 0)
            seq = read_seq(before)
            _, length, held = read_round(before)
            if seq & 1 or not seq or held != digest or not 0 < length <= view.nbytes:
                return None
            copy = bytes(view[:length])
            after = os.pread(fd, ROUND_END, 0)
        finally:
            os.close(fd)
        return copy if after == before else None

    def read(self, handle: Any) -> memoryview:
        if type(handle) is Slot:
            return memoryview(handle.data)
        return super().read(handle)

    def read_range(self, handle: Any, start: int, stop: int) -> memoryview:
        if type(handle) is Slot:
            return memoryview(handle.data)[start:stop]
        return super().read_range(handle, start, stop)

    def read_into(self, handle: Any, out: memoryview) -> int:
        if type(handle) is Slot:
            out[: handle.size] = memoryview(handle.data)
            return handle.size
        return super().read_into(handle, out)

    def tensor(self, handle: Any) -> Any:
        if type(handle) is not Slot:
            return super().tensor(handle)
        import warnings

        import torch

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # a read-only mapping, read-only as documented
            return torch.frombuffer(handle.data, dtype=torch.uint8)

    def drop(self, handle: Any) -> None:
        if type(handle) is Slot:
            handle.free()
            return
        # HostTier.drop pools a buffer only when its caller held it as a temporary (its
        # reference count says nobody views it): hand it on so, with no reference left here.
        held = [handle]
        del handle
        HostTier.drop(self, held.pop())

    def _sweep_orphans(self) -> None:
        now = time.monotonic()
        if now - self._swept < ORPHAN_AGE / 4:
            return
        self._swept = now
        cutoff = time.time() - ORPHAN_AGE
        with contextlib.suppress(OSError):
            for entry in os.scandir(self.folder):
                if entry.name.startswith("up-") and entry.stat(follow_symlinks=False).st_mtime < cutoff:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(entry.path)
                elif entry.name.startswith("w-") and _writer_gone(entry.name):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(entry.path)

    def close(self) -> None:
        super().close()
        shutil.rmtree(self.folder, ignore_errors=True)
        shutil.rmtree(self.names, ignore_errors=True)


def attach(folder: str, token: str) -> bool:
    """Whether ``folder`` is, seen from this process, the shared folder of the node whose
    token is ``token``: the same host (a folder of that name on another host holds another
    token, or none)."""
    try:
        with open(os.path.join(folder, ID_FILE)) as f:
            return f.read().split()[0] == token and os.access(folder, os.W_OK)
    except (OSError, IndexError):
        return False


__all__ = ["ASK", "DEADLINE_AT", "SERIAL", "SLOT", "HEADER", "LIVE", "FREED", "HEAD_SIZE", "KEPT_AT", "NAMED_END", "NAMES",
           "RECYCLABLE", "ROUND_AT", "ROUND_END", "STATE_AT", "ShmTier", "ShmUpload", "Slot", "attach", "header",
           "name_digest", "read_header", "read_named", "read_round", "read_seq", "rows_round", "rows_slot", "write_round", "write_seq"]
