"""Transports carry SDCP requests as bytes between roles, with the peer's identity.

``base`` defines what every transport carries (:class:`Request`, :class:`Response`) and the
client interface (:class:`Transport`); ``inprocess`` calls handlers directly; the HTTP/2 +
mutual TLS transport serves and reaches them across processes (§5.1). No transport knows
what a message means, and no role knows which transport called it.
"""

from sdcp_fast.transport.base import Handler, Request, Response, Transport

__all__ = ["Handler", "Request", "Response", "Transport"]
