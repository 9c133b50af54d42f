"""Who a peer is, from its authenticated identity (§5.1 mutual TLS, §6.3 authorization).

A transport authenticates the peer (the client certificate in TLS 1.3 mutual
authentication, or the caller's configured identity in process) and hands the core the
certificate's URI subject alternative names. Our scheme (docs/interpretations.md, "Peer
identity"): an instance certificate holds

- its **base URI**, e.g. ``https://127.0.0.1:8443/``: the ``drafter`` and ``verifier`` base
  URIs that assignments and proposals name (§6.1, §6.3) are compared with it; and
- its **role**, as the URN ``urn:sdcp:role:<name>`` with ``<name>`` one of :class:`PeerRole`.

A certificate with no role URN, or with more than one, has no role: it may read what any
authenticated client may read, and act as no role. A role's resources check the peer with
:func:`require_role` (a drafter certificate acts only as a drafter, a router's only as a
router); the verifier session then compares the base URI with the assigned drafter (§6.3).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass

from sdcp_fast.protocol.problems import Forbidden

ROLE_URN = "urn:sdcp:role:"


class PeerRole(enum.Enum):
    DRAFTER = "drafter"
    VERIFIER = "verifier"
    ROUTER = "router"
    MLC = "mlc"
    CLIENT = "client"  # a front end or operator tool: reads output, acts as no SDCP role


@dataclass(frozen=True)
class Peer:
    """An authenticated peer: its base URI (None if the certificate names none) and role."""

    uri: str | None
    role: PeerRole | None

    def is_(self, role: PeerRole) -> bool:
        return self.role is role


def role_uri(role: PeerRole) -> str:
    """The URI SAN that gives a certificate ``role``."""
    return ROLE_URN + role.value


def peer_from_uris(uris: Iterable[str]) -> Peer:
    """The peer named by a certificate's URI SANs (the scheme in the module doc)."""
    base: list[str] = []
    roles: list[PeerRole] = []
    for uri in uris:
        if uri.startswith(ROLE_URN):
            try:
                roles.append(PeerRole(uri[len(ROLE_URN):]))
            except ValueError:
                continue  # a role we do not know grants nothing
        elif uri.startswith(("https://", "http://", "inproc://")):
            base.append(uri)
    return Peer(uri=base[0] if len(base) == 1 else None, role=roles[0] if len(set(roles)) == 1 else None)


def same_instance(a: str, b: str) -> bool:
    """Whether two base URIs name the same instance (a trailing slash is not significant)."""
    return a.rstrip("/") == b.rstrip("/")


def require_role(peer: Peer | None, *roles: PeerRole) -> Peer:
    """``peer`` if its certificate gives it one of ``roles``, else :class:`Forbidden` (403).

    None (a transport that authenticated nobody) holds no role, so it is refused too; a
    deployment that runs without authentication must not call this.
    """
    if peer is None or peer.role is None or peer.role not in roles:
        held = "no identity" if peer is None else f"role {peer.role.value if peer.role else 'none'}"
        wanted = " or ".join(role.value for role in roles) or "no role"
        raise Forbidden(f"peer with {held} may not act as {wanted}")
    return peer
