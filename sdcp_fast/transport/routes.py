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


# Answers kept per (method, path): a verifier's rounds ask for the same few paths (its
# proposals, each session's output) over and over; the patterns are tried once per path.
MEMO_SIZE = 4096


class RouteTable(Generic[E]):
    def __init__(self) -> None:
        self._routes: list[tuple[str, re.Pattern[str], E]] = []
        # The endpoint and its groups, or None and the methods a NoRoute lists.
        self._memo: dict[tuple[str, str], tuple[tuple[E, dict[str, str]] | None, tuple[str, ...]]] = {}

    def add(self, method: str, pattern: str, endpoint: E) -> None:
        """``pattern`` must match the whole path (relative to the server's root, no leading
        slash); its named groups are handed to the endpoint."""
        self._routes.append((method, re.compile(pattern), endpoint))
        self._memo.clear()

    def match(self, method: str, path: str) -> tuple[E, dict[str, str]]:
        """The endpoint for ``method path`` and the path's named groups (NoRoute if none)."""
        key = (method, path)
        known = self._memo.get(key)
        if known is None:
            if len(self._memo) >= MEMO_SIZE:
                self._memo.clear()  # paths are the peers' to choose: the memo stays bounded
            try:
                known = self._memo[key] = (self._match(method, path), ())
            except NoRoute as none:
                self._memo[key] = (None, none.allowed)
                raise
        found, allowed = known
        if found is None:
            raise NoRoute(method, path, allowed)
        return found[0], dict(found[1])  # the caller's own copy

    def _match(self, method: str, path: str) -> tuple[E, dict[str, str]]:
        allowed: list[str] = []
        for m, pattern, endpoint in self._routes:
            found = pattern.fullmatch(path)
            if found is None:
                continue
            if m == method:
                return endpoint, found.groupdict()
            allowed.append(m)
        raise NoRoute(method, path, tuple(dict.fromkeys(allowed)))
