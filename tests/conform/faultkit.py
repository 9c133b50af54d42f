"""Tools for building a wrong verifier through tests/conform/harness.py's hook: a
:func:`rewrite` of its requests and answers, problems and verdicts edited, and the
:class:`Fault` record of one deliberate violation (tests/conform/faults.py lists them)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from sdcp_fast.protocol import Proposal, Verdict
from sdcp_fast.transport.base import Request, Response

Handler = Callable[[Request], Any]
PROBLEM = {"content-type": "application/problem+json"}


def problem(status: int, suffix: str, **extra: Any) -> Response:
    body = {"type": f"urn:ietf:params:sdcp:problem:{suffix}", "title": suffix, "status": status, **extra}
    return Response(status, json.dumps(body).encode(), PROBLEM)


def suffix_of(response: Response) -> str | None:
    if not response.content_type.startswith("application/problem+json"):
        return None
    return str(json.loads(response.body).get("type", "")).rsplit(":", 1)[-1]


def retyped(response: Response, status: int, suffix: str) -> Response:
    body = json.loads(response.body)
    body["type"], body["status"] = f"urn:ietf:params:sdcp:problem:{suffix}", status
    return Response(status, json.dumps(body).encode(), PROBLEM)


def verdict_edited(response: Response, **changes: Any) -> Response:
    v = Verdict.decode(response.body)
    return Response(200, replace(v, **changes).encode(), response.headers)


def proposal_of(request: Request) -> Proposal | None:
    if request.method == "POST" and request.path == "proposals":
        try:
            return Proposal.decode(request.body)
        except Exception:  # noqa: BLE001 - a malformed body is the verifier's to refuse
            return None
    return None


def rewrite(pre: Callable[..., Any] | None = None, post: Callable[..., Any] | None = None) -> Callable[[Handler], Handler]:
    """A hook from two functions: ``pre(request, handler, memory)`` may answer (a Response)
    or return a request to pass on; ``post(request, response, memory)`` the answer to give."""
    def wrap(handler: Handler) -> Handler:
        memory: dict[str, Any] = {}

        async def answer(request: Request) -> Response:
            if pre is not None:
                out = await pre(request, handler, memory)
                if isinstance(out, Response):
                    return out
                request = out or request
            response = await handler(request)
            return post(request, response, memory) if post is not None else response
        return answer
    return wrap


@dataclass
class Fault:
    name: str
    catches: tuple[str, ...]
    groups: tuple[str, ...]
    wrap: Callable[[Handler], Handler] | None = None
    patches: list[tuple[Any, str, Any]] = field(default_factory=list)
    scorer: Any = None
    kit: dict[str, Any] = field(default_factory=dict)
