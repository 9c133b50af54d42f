"""A route table: ``(method, path pattern) -> endpoint``, shared by every server of the
project (the roles' :class:`~sdcp_fast.roles.wire.Routes`, the MLC's
:class:`~sdcp_fast.mlc_server.server.MLCService`). It only matches; each server answers a path
no pattern takes (404) or a method its patterns do not list (405) in its own terms."""

from __future__ import annotations

import re
from typing import Generic, TypeVar

E = TypeVar("E")


class NoRoute(LookupError):
    """No route takes ``method path``; ``allowed`` lists the methods that would (405), empty
    when no pattern matches the path at all (404)."""

    def __init__(self, method: str, path: str, allowed: tuple[str, ...]) -> None:
        super().__init__(f"{method} /{path}")
        self.method, self.path, self.allowed = method, path, allowed


class RouteTable(Generic[E]):
    def __init__(self) -> None:
        self._routes: list[tuple[str, re.Pattern[str], E]] = []

    def add(self, method: str, pattern: str, endpoint: E) -> None:
        """``pattern`` must match the whole path (relative to the server's root, no leading
        slash); its named groups are handed to the endpoint."""
        self._routes.append((method, re.compile(pattern), endpoint))

    def match(self, method: str, path: str) -> tuple[E, dict[str, str]]:
        """The endpoint for ``method path`` and the path's named groups (NoRoute if none)."""
        allowed: list[str] = []
        for m, pattern, endpoint in self._routes:
            found = pattern.fullmatch(path)
            if found is None:
                continue
            if m == method:
                return endpoint, found.groupdict()
            allowed.append(m)
        raise NoRoute(method, path, tuple(dict.fromkeys(allowed)))
