"""Problems the transports answer by themselves (RFC 9457), before or after a handler runs.

These are HTTP-level failures, not SDCP problems: type ``about:blank`` with the status's
reason phrase as title, as RFC 9457 §4.2.1 asks. The detail never carries a traceback.
:func:`problem_of` is the client side: the exception a problem response stands for.
"""

from __future__ import annotations

import http
import json
from collections.abc import Mapping
from typing import Any

from sdcp_fast.protocol.problems import PROBLEM_MEDIA_TYPE, SdcpProblem, problem_from_response, type_suffix
from sdcp_fast.transport.base import Response


def problem_response(problem: SdcpProblem) -> Response:
    """``problem`` as its RFC 9457 document with its status."""
    return Response(problem.status, problem.render(), {"content-type": PROBLEM_MEDIA_TYPE})


def http_problem(status: int, detail: str = "") -> Response:
    body = {"type": "about:blank", "title": http.HTTPStatus(status).phrase, "status": status}
    if detail:
        body["detail"] = detail
    return Response(status, json.dumps(body).encode(), {"content-type": PROBLEM_MEDIA_TYPE})


INTERNAL_ERROR_DETAIL = "the request handler failed; the server log has the details"


def problem_body(response: Response) -> dict[str, Any] | None:
    """The RFC 9457 object a problem response carries, or None (no body, not JSON, not a map)."""
    if not response.content_type.startswith(PROBLEM_MEDIA_TYPE):
        return None
    try:
        doc = json.loads(response.body)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def problem_of(response: Response, ours: Mapping[str, type[SdcpProblem]],
               by_status: Mapping[int, type[SdcpProblem]] | None = None) -> SdcpProblem:
    """The problem a client received, as the class ``ours`` gives its type suffix, else the
    class ``by_status`` gives its status, else the project-wide mapping of
    :func:`~sdcp_fast.protocol.problems.problem_from_response`."""
    return problem_in(response.status, problem_body(response), ours, by_status)


def problem_in(status: int, body: Mapping[str, Any] | None, ours: Mapping[str, type[SdcpProblem]],
               by_status: Mapping[int, type[SdcpProblem]] | None = None) -> SdcpProblem:
    """:func:`problem_of` for a problem object that came inside another body (an entry of a
    batch's answer): ``status`` and the decoded RFC 9457 members."""
    generic = problem_from_response(status, body)
    cls = ours.get(type_suffix(generic.type_uri))
    if cls is None and by_status is not None:
        cls = by_status.get(status)
    if cls is None:
        return generic
    return cls(generic.detail if generic.detail != generic.title else "", extra=generic.extra)
