"""Problems the transports answer by themselves (RFC 9457), before or after a handler runs.

These are HTTP-level failures, not SDCP problems: type ``about:blank`` with the status's
reason phrase as title, as RFC 9457 §4.2.1 asks. The detail never carries a traceback.
"""

from __future__ import annotations

import http
import json

from sdcp_fast.protocol.problems import PROBLEM_MEDIA_TYPE
from sdcp_fast.transport.base import Response


def http_problem(status: int, detail: str = "") -> Response:
    body = {"type": "about:blank", "title": http.HTTPStatus(status).phrase, "status": status}
    if detail:
        body["detail"] = detail
    return Response(status, json.dumps(body).encode(), {"content-type": PROBLEM_MEDIA_TYPE})


INTERNAL_ERROR_DETAIL = "the request handler failed; the server log has the details"
