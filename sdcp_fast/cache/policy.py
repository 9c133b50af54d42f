"""Who may touch what in an MLC served to the network (docs/security.md, "MLC").

The peer is the one the transport authenticated (a client certificate's URI SANs, read
by :func:`sdcp_fast.protocol.peer.peer_from_uris`): its base URI is its identity and
``urn:sdcp:role:*`` its role. ``None`` means the transport authenticated nobody (plain
HTTP, or TLS without client certificates): nothing is checked, as for in-process callers.

Each function returns the check the store runs under its lock (see ``MLC.put``'s
``check``) or raises :class:`Forbidden` at once; ``None`` means no check. A router is the
control plane: it may do anything to any object or log (clean-up after failover).
"""

from __future__ import annotations

from sdcp_fast.cache.index import Head, LeaseCheck, ObjectCheck
from sdcp_fast.cache.uri import ObjectName, writer_tag
from sdcp_fast.protocol.commitlog import FenceRecord, LogRecord
from sdcp_fast.protocol.peer import Peer, PeerRole
from sdcp_fast.protocol.problems import Forbidden

D, V, R, C, M = PeerRole.DRAFTER, PeerRole.VERIFIER, PeerRole.ROUTER, PeerRole.CLIENT, PeerRole.MLC

# kind -> roles that may create an object of that kind (its writer then owns it).
CREATE: dict[str, frozenset[PeerRole]] = {
    "q_rows": frozenset({D}), "draft_kv": frozenset({D}), "prompt_kv": frozenset({D}),
    "target_kv": frozenset({V}), "committed_tokens": frozenset({V}), "prompt": frozenset({V}),
}
# kind -> roles that may read an object of that kind besides its owner.
READ: dict[str, frozenset[PeerRole]] = {
    "q_rows": frozenset({D, V}), "draft_kv": frozenset({D, V}), "prompt_kv": frozenset({D, V}),
    "target_kv": frozenset({V}), "committed_tokens": frozenset({D, V, C}), "prompt": frozenset({D, V, C}),
}
# kind -> roles that may lease an object of that kind besides its owner (a verifier holds
# the round's draft objects until its commit).
LEASE: dict[str, frozenset[PeerRole]] = {"q_rows": frozenset({V}), "draft_kv": frozenset({V})}
READ_LOGS = frozenset({V, R})
STATS = frozenset({R, M, C})


def _role(peer: Peer) -> str:
    return peer.role.value if peer.role is not None else "no role"


def principal(peer: Peer | None) -> str | None:
    """The identity stored as an object's owner or a lease's holder."""
    return None if peer is None else peer.uri


def _need_identity(peer: Peer) -> str:
    if peer.uri is None:
        raise Forbidden("the client certificate names no single base URI (URI SAN): it cannot own objects")
    return peer.uri


def _owner_or_router(peer: Peer, head: Head, action: str, name: ObjectName) -> None:
    if peer.is_(R) or (peer.uri is not None and head.owner == peer.uri):
        return
    raise Forbidden(f"only the writer of {name} or a router may {action} it; the peer is a {_role(peer)}")


def may_put(peer: Peer | None, name: ObjectName) -> ObjectCheck | None:
    if peer is None:
        return None
    if not peer.is_(R):
        if peer.role not in CREATE.get(name.kind, frozenset()):
            raise Forbidden(f"a {_role(peer)} may not write {name.kind} objects")
        writer = _need_identity(peer)
        if name.tag is not None and name.tag != writer_tag(writer):
            # A tagged name is its writer's alone (cache/uri.py): nobody takes it first.
            raise Forbidden(f"{name} carries another writer's tag; this peer's is {writer_tag(writer)}")

    def check(head: Head | None) -> None:
        if head is not None:
            _owner_or_router(peer, head, "overwrite", name)

    return check


def may_delete(peer: Peer | None, name: ObjectName) -> ObjectCheck | None:
    if peer is None:
        return None
    return lambda head: _owner_or_router(peer, head, "delete", name)  # type: ignore[arg-type]


def may_read(peer: Peer | None, name: ObjectName) -> ObjectCheck | None:
    if peer is None or peer.is_(R) or peer.role in READ.get(name.kind, frozenset()):
        return None

    def check(head: Head | None) -> None:
        if head is None or peer.uri is None or head.owner != peer.uri:
            raise Forbidden(f"a {_role(peer)} may not read {name.kind} objects it did not write")

    return check


def may_lease(peer: Peer | None, name: ObjectName) -> ObjectCheck | None:
    if peer is None:
        return None
    _need_identity(peer)
    if peer.is_(R) or peer.role in LEASE.get(name.kind, frozenset()):
        return None
    return lambda head: _owner_or_router(peer, head, "lease", name)  # type: ignore[arg-type]


def may_hold(peer: Peer | None) -> LeaseCheck | None:
    """Renewing or releasing a lease: its holder, or a router."""
    if peer is None or peer.is_(R):
        return None

    def check(holder: str | None) -> None:
        if peer.uri is None or holder != peer.uri:
            raise Forbidden("only the holder of a lease or a router may renew or release it")

    return check


def may_read_log(peer: Peer | None) -> None:
    if peer is not None and peer.role not in READ_LOGS:
        raise Forbidden(f"a {_role(peer)} may not read commit logs")


def may_append_some(peer: Peer | None) -> None:
    """Whether the peer may append any record at all (checked before the body is read)."""
    if peer is not None and peer.role not in (V, R):
        raise Forbidden(f"a {_role(peer)} may not append to commit logs")


def may_append(peer: Peer | None, record: LogRecord) -> None:
    if peer is None:
        return
    if isinstance(record, FenceRecord):
        if not peer.is_(R):
            raise Forbidden(f"only a router writes fences; the peer is a {_role(peer)}")
    elif not peer.is_(V):
        raise Forbidden(f"only a verifier appends commit records; the peer is a {_role(peer)}")


def may_see_stats(peer: Peer | None) -> None:
    if peer is not None and peer.role not in STATS:
        raise Forbidden(f"a {_role(peer)} may not read the MLC's statistics")
