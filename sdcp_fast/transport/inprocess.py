"""The in-process transport: requests go straight to the handler registered for a base URI.

Each caller gets its own view (:meth:`InProcessNetwork.transport`) bound to the identity it
is configured with, which the handler receives as the request's peer, exactly as the
network transport hands over the identity from the client certificate. Bodies stay bytes:
roles encode and decode on this path as they do on the wire; a streamed body
(``Response.stream``) is the handler's own iterator, passed through.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from dataclasses import replace

from sdcp_fast.protocol.peer import Peer, same_instance
from sdcp_fast.transport.base import Handler, Request, Response


class Unreachable(ConnectionError):
    """No instance is registered at that base URI (or it was taken down)."""


class InProcessNetwork:
    """Base URI -> handler, for the roles living in one process."""

    def __init__(self) -> None:
        self._handlers: dict[str, Handler] = {}

    def register(self, base_uri: str, handler: Handler) -> None:
        self._handlers[base_uri.rstrip("/")] = handler

    def unregister(self, base_uri: str) -> None:
        """Take an instance down: later requests to it fail as a dead peer's would."""
        self._handlers.pop(base_uri.rstrip("/"), None)

    def transport(self, peer: Peer) -> InProcessTransport:
        return InProcessTransport(self, peer)

    def handler(self, base_uri: str) -> Handler:
        for uri, handler in self._handlers.items():
            if same_instance(uri, base_uri):
                return handler
        raise Unreachable(f"no instance at {base_uri}")


class InProcessTransport:
    """:class:`sdcp_fast.transport.Transport` over direct calls, as ``peer``."""

    def __init__(self, network: InProcessNetwork, peer: Peer) -> None:
        self.network = network
        self.peer = peer

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
        handler = self.network.handler(base_uri)
        call = handler(Request(method=method, path=path, query=dict(query or {}), body=bytes(body),
                               headers={k.lower(): v for k, v in (headers or {}).items()}, peer=self.peer))
        if timeout is None:
            return await call
        # As over the network: no response in time is a TimeoutError and the handler is cancelled.
        return await asyncio.wait_for(call, timeout)

    async def request_stream(
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
        """:meth:`request` with the body always as ``Response.stream`` (as the HTTP/2 client's)."""
        response = await self.request(base_uri, method, path, body=body, query=query, headers=headers,
                                      timeout=timeout)
        if response.stream is not None:
            return response
        return replace(response, body=b"", stream=_once(response.body))

    async def close(self) -> None:
        return None


async def _once(body: bytes) -> AsyncIterator[bytes]:
    if body:
        yield body
