"""Transports carry SDCP requests as bytes between roles, with the peer's identity.

``base`` defines what every transport carries (:class:`Request`, :class:`Response`) and the
client interface (:class:`Transport`); ``inprocess`` calls handlers directly; the HTTP/2 +
mutual TLS transport serves and reaches them across processes (§5.1). No transport knows
what a message means, and no role knows which transport called it.
"""

from __future__ import annotations

from ssl import SSLContext

from sdcp_fast.transport.base import Handler, Request, Response, Transport
from sdcp_fast.transport.errors import TransportError, TransportTimeout

# The network transport lives in its own modules so importing this package pulls in no
# h2/TLS code: ``tls`` (contexts, peer_of), ``h2server.serve``, ``h2client.H2Transport``,
# ``http1`` (debugging), ``certs`` (development CA); :func:`http_transport` picks a client.
__all__ = ["Handler", "Request", "Response", "Transport", "TransportError", "TransportTimeout", "http_transport"]


def http_transport(ssl: SSLContext | None = None, *, http1: bool = False, timeout: float | None = 30.0,
                   max_body: int | None = None, max_frame: int | None = None) -> Transport:
    """A client transport: HTTP/2 (h2c on loopback without ``ssl``; responses up to
    ``max_body``, DATA frames up to ``max_frame`` asked of the server), or HTTP/1.1 when
    ``http1`` (for a server run with ``--http1``)."""
    if http1:
        from sdcp_fast.transport.http1 import Http1Transport

        return Http1Transport(ssl, insecure=ssl is None, timeout=timeout)
    from dataclasses import replace

    from sdcp_fast.transport.h2client import CLIENT_LIMITS
    from sdcp_fast.transport.nativeclient import h2_client

    limits = CLIENT_LIMITS
    if max_body is not None:
        limits = replace(limits, max_body=max_body)
    if max_frame is not None:
        limits = replace(limits, max_frame=max_frame)
    return h2_client(ssl, insecure=ssl is None, timeout=timeout, limits=limits)
