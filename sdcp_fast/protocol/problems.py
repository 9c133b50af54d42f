"""SDCP problem types (draft Table 2) as exceptions that carry their wire identity.

Every error the core reports is an :class:`SdcpProblem`; any other exception out of
``sdcp_fast.protocol`` is a bug. Rendering follows RFC 9457 (see docs/interpretations.md
for the chosen media type and type URI base).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, ClassVar

PROBLEM_MEDIA_TYPE = "application/problem+json"
PROBLEM_TYPE_BASE = "urn:ietf:params:sdcp:problem:"


class SdcpProblem(Exception):
    """Base of all protocol problems. Subclasses fix ``suffix``, ``status`` and ``title``."""

    suffix: ClassVar[str] = "sdcp-bad-request"
    status: ClassVar[int] = 400
    title: ClassVar[str] = "Malformed SDCP message"

    def __init__(self, detail: str = "", *, extra: dict[str, Any] | None = None) -> None:
        super().__init__(detail or self.title)
        self.detail = detail or self.title
        # Extension members of the problem body, e.g. the current session-state on a 409.
        self.extra: dict[str, Any] = dict(extra or {})

    @property
    def type_uri(self) -> str:
        return PROBLEM_TYPE_BASE + self.suffix

    def to_dict(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "type": self.type_uri,
            "title": self.title,
            "status": self.status,
            "detail": self.detail,
        }
        body.update(self.extra)
        return body

    def render(self) -> bytes:
        """The RFC 9457 body, UTF-8 JSON, for ``Content-Type: application/problem+json``."""
        return json.dumps(self.to_dict(), sort_keys=True, default=_jsonable).encode()


def _jsonable(value: object) -> object:
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).hex()
    raise TypeError(f"not JSON-serialisable: {type(value).__name__}")


class BadRequest(SdcpProblem):
    """A body that is not a well-formed SDCP message (not in Table 2; HTTP 400)."""


class StaleEpoch(SdcpProblem):
    suffix = "sdcp-stale-epoch"
    status = 409
    title = "Epoch is not current"


class StaleBase(SdcpProblem):
    suffix = "sdcp-stale-base"
    status = 409
    title = "Proposal does not extend the committed prefix"


class QUnavailable(SdcpProblem):
    suffix = "sdcp-q-unavailable"
    status = 409
    title = "Draft probabilities required by the rule are unavailable"


class BadContract(SdcpProblem):
    suffix = "sdcp-bad-contract"
    status = 422
    title = "Contract invalid or not supported"


class Limit(SdcpProblem):
    suffix = "sdcp-limit"
    status = 422
    title = "Proposal violates m_cap or m_max"


class SessionClosed(SdcpProblem):
    suffix = "sdcp-session-closed"
    status = 410
    title = "Session has finished or failed"


class BadProposal(SdcpProblem):
    suffix = "sdcp-bad-proposal"
    status = 422
    title = "Proposal inconsistent with its draft distributions"


class NotAssigned(SdcpProblem):
    suffix = "sdcp-not-assigned"
    status = 403
    title = "Drafter is not assigned to the session"


class UnknownSession(SdcpProblem):
    """No such session at this verifier (not in Table 2; HTTP 404)."""

    suffix = "sdcp-unknown-session"
    status = 404
    title = "Unknown session"


class Forbidden(SdcpProblem):
    """The authenticated peer's role may not use this resource (not in Table 2; HTTP 403)."""

    suffix = "sdcp-forbidden"
    status = 403
    title = "Peer's role may not use this resource"


class Busy(SdcpProblem):
    """A documented 5xx: the instance (a role, or the MLC's upload budget) is at a capacity
    bound (docs/security.md, "Limits"); the caller may retry or try another instance."""

    suffix = "sdcp-busy"
    status = 503
    title = "At capacity"


class InternalError(SdcpProblem):
    """A bug, logged where it happened: never a traceback on the wire."""

    suffix = "sdcp-internal-error"
    status = 500
    title = "Internal error"


PROBLEMS: tuple[type[SdcpProblem], ...] = (
    StaleEpoch, StaleBase, QUnavailable, BadContract, Limit, SessionClosed, BadProposal, NotAssigned,
)
_ALL: tuple[type[SdcpProblem], ...] = (*PROBLEMS, BadRequest, UnknownSession, Forbidden)
BY_SUFFIX: dict[str, type[SdcpProblem]] = {cls.suffix: cls for cls in _ALL}


class UnlistedProblem(SdcpProblem):
    """A problem whose type this client does not know: handled by its status class (RFC 9110
    §15: 4xx the request, 5xx the server). ``status`` is the HTTP status received, ``type_uri``
    the type received (``about:blank`` when none was given)."""

    title = "Problem of a type this client does not know"

    def __init__(self, status: int, type_uri: str, detail: str = "", *,
                 extra: dict[str, Any] | None = None) -> None:
        super().__init__(detail or f"HTTP {status}", extra=extra)
        self.http_status = status
        self.received_type = type_uri

    # Instance values in place of the class constants of the listed problems.
    @property
    def status(self) -> int:  # type: ignore[override]
        return self.http_status

    @property
    def suffix(self) -> str:  # type: ignore[override]
        return f"http-{self.http_status // 100}xx"

    @property
    def type_uri(self) -> str:
        return self.received_type

    @property
    def server_error(self) -> bool:
        """A 5xx (or a status outside 4xx): the request may succeed when retried."""
        return not 400 <= self.http_status <= 499


def type_suffix(type_uri: str) -> str:
    """The last segment of a problem type URI: after the last ``/``, ``:`` or ``#``, so that
    ``urn:ietf:params:sdcp:problem:sdcp-stale-epoch`` and
    ``https://example.net/problems/sdcp-stale-epoch`` both give ``sdcp-stale-epoch``."""
    text = type_uri.strip().rstrip("/")
    for sep in ("/", ":", "#"):
        text = text.rsplit(sep, 1)[-1]
    return text


def problem_from_response(status: int, body: Mapping[str, Any] | None) -> SdcpProblem:
    """The problem a client received: ``body`` is the decoded RFC 9457 object (None when the
    body was not one). The type URI is matched on its last segment, so any base that ends in
    a suffix this project knows (Table 2 and the others above) maps to that class; an unknown
    type or no body gives an :class:`UnlistedProblem` handled by the status class (RFC 9110:
    a client handles unlisted codes by class). Members other than type, title, status and
    detail are kept in ``extra`` (the 409s' ``session_state``).
    """
    if isinstance(status, bool) or not isinstance(status, int) or not 100 <= status <= 599:
        status = 500  # not an HTTP status: the exchange itself failed
    kind = "about:blank"
    detail = ""
    extra: dict[str, Any] = {}
    if isinstance(body, Mapping):
        raw_kind = body.get("type")
        if isinstance(raw_kind, str) and raw_kind.strip():
            kind = raw_kind.strip()
        text = body.get("detail")
        detail = text if isinstance(text, str) else ""
        extra = {k: v for k, v in body.items()
                 if isinstance(k, str) and k not in ("type", "title", "status", "detail")}
    cls = BY_SUFFIX.get(type_suffix(kind))
    if cls is None:
        return UnlistedProblem(status, kind, detail, extra=extra)
    return cls(detail, extra=extra)
