"""What a transport carries: a request with its authenticated peer, and a response.

Servers build a :class:`Request` per HTTP request (method, path without the base URI's
path, decoded query, body bytes, the peer from the client certificate) and hand it to a
:data:`Handler`; clients send one through :meth:`Transport.request` to a base URI. A handler
that is also a :class:`DirectHandler` answers its hot routes without either: the native
server (nativeserver.py) asks it first.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from sdcp_fast.protocol.peer import Peer


# Slots: a frozen dataclass without them sets each field through object.__setattr__ and a
# __dict__, twice the cost of building one, and servers build one or two per request.
@dataclass(frozen=True, slots=True)
class Request:
    method: str  # "GET", "POST", "PUT", ...
    path: str  # relative to the role's base URI, no leading slash: "sessions/{id}/output"
    query: Mapping[str, str] = field(default_factory=dict)
    body: bytes = b""
    headers: Mapping[str, str] = field(default_factory=dict)  # lower-case names
    peer: Peer | None = None  # None: the transport authenticated nobody (--insecure)


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    body: bytes = b""
    headers: Mapping[str, str] = field(default_factory=dict)  # lower-case names
    # A body sent as it is produced (server side) or read as it arrives (a client's
    # ``request_stream``); ``body`` is then empty. Whoever stops reading early closes it
    # (``aclose``), which is how a producer learns that its client went away.
    stream: AsyncIterator[bytes] | None = field(default=None, compare=False, repr=False)

    @property
    def content_type(self) -> str:
        return self.headers.get("content-type", "")


Handler = Callable[[Request], Awaitable[Response]]
"""A role's request handler: every transport calls the same one."""


@runtime_checkable
class DirectHandler(Protocol):
    """A :data:`Handler` whose hot routes are also answered in a plain call, with no
    :class:`Request`, task or coroutine per request: a server calls :meth:`answer_now` from its
    loop callback and falls back to ``__call__`` when it returns None."""

    def __call__(self, request: Request) -> Awaitable[Response]:
        ...

    def answer_now(self, method: str, path: str, query: Mapping[str, str], body: bytes, headers: Mapping[str, str],
                   peer: Peer | None) -> Response | asyncio.Future[Any] | None:
        """The answer to a request (``path`` relative and unquoted, as in :class:`Request`), or a
        future whose outcome :meth:`settled` turns into it, or None: not a route answered here."""
        ...

    def settled(self, future: asyncio.Future[Any]) -> Response:
        """The answer a done future of :meth:`answer_now` stands for (CancelledError if it was
        cancelled: no answer, as for a cancelled handler)."""
        ...


class Transport(Protocol):
    """The client side: send ``method path`` to the instance at ``base_uri``."""

    async def request(
        self,
        base_uri: str,
        method: str,
        path: str,
        *,
        body: bytes = b"",
        query: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> Response:
        ...

    async def close(self) -> None:
        ...
