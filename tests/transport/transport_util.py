"""Helpers of the transport tests: certificate paths, a loop runner, an echo handler."""

from __future__ import annotations

import json
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

from sdcp_fast.transport import loop
from sdcp_fast.transport.base import Request, Response

T = TypeVar("T")

SERVER_URI = "https://127.0.0.1:8501/"
CLIENT_URI = "https://127.0.0.1:8511/"


class Certs:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.ca = str(root / "ca.pem")

    def pair(self, name: str) -> tuple[str, str]:
        return str(self.root / f"{name}.pem"), str(self.root / f"{name}.key")


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run a scenario on a fresh loop: the one the services use (uvloop when installed)."""
    return loop.run(coro)


async def echo(request: Request) -> Response:
    """Echo the body; ``whoami`` describes the request instead; ``boom`` fails."""
    if request.path == "boom":
        raise RuntimeError("secret internal detail")
    if request.path == "whoami":
        peer = request.peer
        info = {"method": request.method, "path": request.path, "query": dict(request.query),
                "headers": dict(request.headers),
                "peer": None if peer is None else {"uri": peer.uri, "role": peer.role and peer.role.value}}
        return Response(200, json.dumps(info).encode(), {"content-type": "application/json"})
    return Response(200, request.body, {"content-type": "application/sdcp+cbor"})
