"""TLS 1.3 with mutual certificate authentication, as §5.1 requires, and the peer it proves.

Both contexts require TLS 1.3, verify the other side against the configured CA only (never
the system store: SDCP peers are the operator's own instances), and offer ALPN ``h2``. The
server requires a client certificate; the client verifies the server's name against the
certificate's DNS/IP SANs. :func:`peer_of` turns a verified peer certificate into the
:class:`~sdcp_fast.protocol.peer.Peer` handlers see (its URI SANs, see peer.py).
"""

from __future__ import annotations

import ssl
from collections.abc import Sequence
from typing import cast

from sdcp_fast.protocol.peer import Peer, peer_from_uris

ALPN_H2 = "h2"


def _common(ctx: ssl.SSLContext, cert: str, key: str, ca: str, alpn: Sequence[str]) -> ssl.SSLContext:
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.load_cert_chain(cert, key)
    ctx.load_verify_locations(cafile=ca)
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.set_alpn_protocols(list(alpn))
    return ctx


class ServerContext(ssl.SSLContext):
    """A :func:`server_context`: the files it was made from travel with it, so that a server
    whose TLS is not Python's (transport.nativeserver) configures the same."""

    files: tuple[str, str, str]  # certificate chain, key, CA


def server_context(cert: str, key: str, ca: str, *, alpn: Sequence[str] = (ALPN_H2,)) -> ServerContext:
    """Server side: our certificate, and a client certificate signed by ``ca`` REQUIRED."""
    ctx = ServerContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.files = (cert, key, ca)
    _common(ctx, cert, key, ca, alpn)
    return ctx


class ClientContext(ssl.SSLContext):
    """A :func:`client_context`: the files it was made from travel with it, so that a client
    whose TLS is not Python's (transport.nativeclient) configures the same."""

    files: tuple[str, str, str]  # certificate chain, key, CA


def client_context(cert: str, key: str, ca: str, *, alpn: Sequence[str] = (ALPN_H2,)) -> ssl.SSLContext:
    """Client side: our certificate, and the server's verified against ``ca`` and its name."""
    ctx = ClientContext(ssl.PROTOCOL_TLS_CLIENT)  # check_hostname and CERT_REQUIRED by default
    ctx.files = (cert, key, ca)
    return _common(ctx, cert, key, ca, alpn)


def peer_of(ssl_object: ssl.SSLObject | ssl.SSLSocket | None) -> Peer | None:
    """The authenticated peer of a TLS connection, or None without a verified certificate.

    ``getpeercert()`` returns the decoded certificate only once it was verified, which the
    contexts above make a condition of the handshake."""
    if ssl_object is None:
        return None
    cert = ssl_object.getpeercert()
    if not cert:
        return None
    sans = cast("tuple[tuple[str, str], ...]", cert.get("subjectAltName", ()))
    return peer_from_uris(value for kind, value in sans if kind == "URI")
