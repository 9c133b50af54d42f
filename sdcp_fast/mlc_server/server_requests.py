"""A request to the MLC server as its routes see it (:class:`Call`), the bounds on what a
request may hold (one body's limit, the :class:`UploadBudget` of all uploads in flight), the
answer a route's failure becomes (:func:`answer_for`: a problem document, never a
traceback), and a batch append's entries and answers (:func:`batch_appends`,
:func:`entry_answer`, :func:`batch_answer`). Both carriers of :mod:`sdcp_fast.mlc_server.server` use them: the HTTP/2
transport hands over whole bodies, the HTTP/1.1 application streams them in
(:mod:`sdcp_fast.mlc_server.server_http1`)."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from sdcp_fast.commitlog.http import MAX_BATCH
from sdcp_fast.protocol import cbor
from sdcp_fast.protocol.peer import Peer
from sdcp_fast.protocol.problems import BadRequest, Busy, InternalError, SdcpProblem
from sdcp_fast.transport.base import Response
from sdcp_fast.transport.problem import problem_response

log = logging.getLogger("sdcp_fast.mlc_server.server")


class BodyTooLarge(SdcpProblem):
    suffix = "mlc-too-large"
    status = 413
    title = "Request body over the server's limit"


class TooManyAppends(SdcpProblem):
    """A batch append (``POST /logs``) carrying more entries than one request may."""

    suffix = "mlc-too-many-appends"
    status = 413
    title = "More appends than one request may carry"


class Incomplete(SdcpProblem):
    suffix = "mlc-incomplete-body"
    status = 400
    title = "The request body ended early"


class BodyTimeout(SdcpProblem):
    """The body did not arrive in full within the server's request timeout (what the HTTP/2
    transport answers a stalled stream, :class:`~sdcp_fast.transport.h2conn.Limits`)."""

    suffix = "mlc-body-timeout"
    status = 408
    title = "Request body not complete in time"


class UploadBudget:
    """Bytes of object bodies held by uploads in flight (the event loop is the only user)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0

    def take(self, n: int) -> None:
        if self.used + n > self.limit:
            raise Busy(f"{self.used} of {self.limit} upload bytes are in flight", extra={"limit": self.limit})
        self.used += n

    def give(self, n: int) -> None:
        self.used -= n


class Call:
    """One request as the routes see it. ``path`` is relative to the server's root, without
    a leading slash; ``headers`` have lower-case names. A server whose transport hands over
    the whole body (HTTP/2) uses this class; one that streams bodies in overrides
    :meth:`body` to read against the limit as bytes arrive (HTTP/1.1)."""

    def __init__(self, method: str, path: str, query: Mapping[str, str], headers: Mapping[str, str],
                 peer: Peer | None, body: bytes = b"") -> None:
        self.method = method
        self.path = path
        self.query = query
        self.headers = headers
        self.peer = peer
        self._body = body

    @property
    def content_type(self) -> str:
        return self.headers.get("content-type", "").split(";", 1)[0].strip().lower()

    async def body(self, limit: int, budget: UploadBudget | None = None) -> bytearray | bytes:
        """The body, at most ``limit`` bytes, taken from ``budget`` (the caller gives
        ``len(body)`` back when done)."""
        declared = self.headers.get("content-length")
        if len(self._body) > limit or (declared is not None and declared.isdigit() and int(declared) > limit):
            raise BodyTooLarge(f"body over {limit} bytes; this route takes at most {limit}", extra={"limit": limit})
        if budget is not None:
            budget.take(len(self._body))
        return self._body


def answer_for(exc: Exception, method: str, path: str) -> Response:
    """The problem document a route's exception becomes; unknown failures are logged here."""
    if isinstance(exc, SdcpProblem):
        return problem_response(exc)
    if isinstance(exc, ValueError):
        return problem_response(BadRequest(str(exc)))
    if isinstance(exc, ConnectionError):
        # The client went away mid-request: nobody reads an answer, and it is no server fault.
        log.debug("MLC client left during %s %s: %s", method, path, exc)
        return problem_response(Incomplete(str(exc)))
    log.error("MLC request failed: %s %s", method, path, exc_info=exc)
    return problem_response(InternalError())


def release_body(buf: bytearray | bytes) -> None:
    if not isinstance(buf, bytearray):
        return  # immutable: freed with the request that holds it
    try:
        del buf[:]
    except BufferError:
        pass  # still viewed (by a stored object or an exception): its owner frees it


def batch_appends(msg: Any) -> list[tuple[str, bytes, str | None]]:
    """The entries of a ``POST /logs`` body, or BadRequest / TooManyAppends for the whole."""
    appends = msg.get("appends") if isinstance(msg, dict) else None
    if not isinstance(appends, list):
        raise BadRequest("batch append body is {appends: [{log: tstr, record: bstr, ? if_match: tstr}]}")
    if len(appends) > MAX_BATCH:
        raise TooManyAppends(f"{len(appends)} appends; one request carries at most {MAX_BATCH}",
                             extra={"limit": MAX_BATCH})
    out = []
    for i, entry in enumerate(appends):
        if not isinstance(entry, dict):
            raise BadRequest(f"append {i} is not a map")
        name, record, if_match = entry.get("log"), entry.get("record"), entry.get("if_match")
        if not isinstance(name, str) or not isinstance(record, bytes) or not isinstance(if_match, (str, type(None))):
            raise BadRequest(f"append {i} is not {{log: tstr, record: bstr, ? if_match: tstr}}")
        out.append((name, record, if_match))
    return out


# One appended entry's answer, {etag, status: 201} in deterministic CBOR, around its tag.
_APPENDED = b"\xa2" + cbor.deterministic_cbor("etag"), cbor.deterministic_cbor("status") + cbor.deterministic_cbor(201)
_RESULTS = b"\xa1" + cbor.deterministic_cbor("results")


def batch_answer(results: Sequence[str | Exception]) -> bytes:
    """A ``POST /logs`` reply's body, ``{results: [entry_answer(r) ...]}`` as
    ``deterministic_cbor`` writes it: an appended entry's answer is its tag between two
    constant pieces (a pass answers every session it holds: no map built and sorted for each)."""
    head, tail = _APPENDED
    parts = [_RESULTS, _array_head(len(results))]
    for result in results:
        parts.append(head + cbor.deterministic_cbor(result) + tail if isinstance(result, str)
                     else cbor.deterministic_cbor(entry_answer(result)))
    return b"".join(parts)


def _array_head(n: int) -> bytes:
    if n < 24:
        return bytes((0x80 | n,))
    for code, width in ((24, 1), (25, 2), (26, 4), (27, 8)):
        if n < 1 << (8 * width):
            return bytes((0x80 | code,)) + n.to_bytes(width, "big")
    raise ValueError(f"{n} items")


def entry_answer(result: str | Exception) -> dict[str, Any]:
    """One entry's answer in a ``POST /logs`` reply: its new tag, or its problem's members."""
    if isinstance(result, str):
        return {"status": 201, "etag": result}
    if isinstance(result, SdcpProblem):
        return result.to_dict()
    if isinstance(result, ValueError):
        return BadRequest(str(result)).to_dict()
    log.error("MLC batch append entry failed", exc_info=result)
    return InternalError().to_dict()
