"""Why a request did not get a response: the network transports' client-side errors.

A response of any status is not an error here (the caller reads problems from it); these
are raised only when no response arrived. ``retryable`` says the peer provably did not
process the request (refused stream, or a GOAWAY whose last stream id is below ours), so a
client may resend it on a new connection without risking a second effect.
"""

from __future__ import annotations


class TransportError(ConnectionError):
    """No response: the connection was refused, failed TLS, closed, or the stream was reset.
    A ``ConnectionError``: to its callers an unreachable peer, as on the in-process transport."""

    def __init__(self, message: str, *, retryable: bool = False) -> None:
        super().__init__(message)
        self.retryable = retryable


class TransportTimeout(TransportError, TimeoutError):
    """No complete response within the request's timeout (the stream is cancelled)."""
