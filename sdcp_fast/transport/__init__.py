"""Transports carry SDCP requests as bytes between roles, with the peer's identity.

``base`` defines what every transport carries (:class:`Request`, :class:`Response`) and the
client interface (:class:`Transport`); ``inprocess`` calls handlers directly; the HTTP/2 +
mutual TLS transport serves and reaches them across processes (§5.1). No transport knows
what a message means, and no role knows which transport called it.
"""

from sdcp_fast.transport.base import Handler, Request, Response, Transport
from sdcp_fast.transport.errors import TransportError, TransportTimeout

# The network transport lives in its own modules so importing this package pulls in no
# h2/TLS code: ``tls`` (contexts, peer_of), ``h2server.serve``, ``h2client.H2Transport``,
# ``http1`` (debugging), ``certs`` (development CA).
__all__ = ["Handler", "Request", "Response", "Transport", "TransportError", "TransportTimeout"]
