"""SDCP over any transport: the resources of Table 1 (§5.1) as a route table on the server
side and typed calls on the client side.

Servers: a role lists its routes; :class:`Routes` decodes nothing itself but turns every
:class:`SdcpProblem` into its RFC 9457 body and status, and any other exception into a 500
problem without a traceback (it is logged). Clients: :class:`SdcpClient` encodes messages,
sends them through a :class:`~sdcp_fast.transport.Transport` and decodes the answer or
raises the problem it carried (matched by type suffix, unlisted statuses by class).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from types import MappingProxyType
from typing import Any, TypeVar

from sdcp_fast.protocol import (
    MEDIA_TYPE,
    Assignment,
    BadRequest,
    Event,
    Output,
    Policy,
    Proposal,
    SdcpProblem,
    SessionOpen,
    SessionState,
    Status,
    Verdict,
    session_path_id,
)
from sdcp_fast.protocol.messages import instance_path_id
from sdcp_fast.protocol.peer import Peer
from sdcp_fast.protocol.problems import InternalError, problem_from_response
from sdcp_fast.roles.retry import retrying
from sdcp_fast.transport.base import Request, Response, Transport
from sdcp_fast.transport.errors import TransportError
from sdcp_fast.transport.problem import problem_body, problem_response
from sdcp_fast.transport.routes import NoRoute, RouteTable

log = logging.getLogger("sdcp_fast.roles")

M = TypeVar("M")
Endpoint = Callable[..., Awaitable[Any]]
# A route's answer in a plain call: (peer, headers, body, query, path groups) -> a message,
# None, a Response, or a future of one of those (roles answer their hot routes so).
DirectEndpoint = Callable[[Peer | None, Mapping[str, str], bytes, Mapping[str, str], dict[str, str]], Any]


class NotFound(SdcpProblem):
    suffix = "sdcp-not-found"
    status = 404
    title = "No such resource"


class MethodNotAllowed(SdcpProblem):
    suffix = "sdcp-method-not-allowed"
    status = 405
    title = "Method not allowed on this resource"


# One mapping for every message answer: read-only, so a server may keep the fields it makes of it.
_MESSAGE_HEADERS: Mapping[str, str] = MappingProxyType({"content-type": MEDIA_TYPE})
_NO_CONTENT = Response(204)


def message_response(message: Any, status: int = 200) -> Response:
    if message is None:
        return _NO_CONTENT
    return Response(status, message.encode(), _MESSAGE_HEADERS)


def _as_response(result: Any) -> Response:
    """An endpoint's result as its answer: a Response as it is, a message (200) or None (204)."""
    return result if isinstance(result, Response) else message_response(result)


class _Direct:
    """A route with an answer in a plain call (:meth:`Routes.add_direct`); awaited, it is the
    route's endpoint for every other server and transport."""

    __slots__ = ("answer",)

    def __init__(self, answer: DirectEndpoint) -> None:
        self.answer = answer

    async def __call__(self, request: Request, **groups: str) -> Any:
        result = self.answer(request.peer, request.headers, request.body, request.query, groups)
        if isinstance(result, asyncio.Future):
            # The caller's cancellation (its client went away) leaves the work to finish: a
            # retry of the same request is answered by its outcome (a drafter's round, say).
            return await asyncio.shield(result)
        return result


class Routes:
    """``(method, path pattern) -> endpoint``; the endpoint gets the request and the path's
    named groups and returns a message (200), None (204) or a :class:`Response`.

    Routes added with :meth:`add_direct` are answered in a plain call as well
    (:meth:`answer_now`, a :class:`~sdcp_fast.transport.base.DirectHandler`): the native
    server builds no request, task or coroutine for them."""

    def __init__(self) -> None:
        self._table = RouteTable[Endpoint]()
        self.add("GET", "health", _healthy)  # liveness for supervisors and load balancers: 204
        self.on_problem: Callable[[SdcpProblem], None] | None = None  # counts problems (roles/metrics.py)

    def add(self, method: str, pattern: str, endpoint: Endpoint) -> None:
        self._table.add(method, pattern, endpoint)

    def add_direct(self, method: str, pattern: str, answer: DirectEndpoint) -> None:
        """A route whose ``answer(peer, headers, body, query, groups)`` returns what an
        endpoint returns, or a future of it; it raises problems as an endpoint does."""
        self._table.add(method, pattern, _Direct(answer))

    def answer_now(self, method: str, path: str, query: Mapping[str, str], body: bytes, headers: Mapping[str, str],
                   peer: Peer | None) -> Response | asyncio.Future[Any] | None:
        try:
            endpoint, groups = self._table.match(method, path)
        except NoRoute:
            return None  # the problem is the general path's to answer
        if type(endpoint) is not _Direct:
            return None
        try:
            result = endpoint.answer(peer, headers, body, query, groups)
        except SdcpProblem as problem:
            return self._problem(problem)
        except Exception:  # a bug: logged here, never a traceback on the wire
            log.exception("%s %s failed", method, path)
            return self._problem(InternalError())
        if isinstance(result, asyncio.Future):
            return result
        return _as_response(result)

    def settled(self, future: asyncio.Future[Any]) -> Response:
        error = future.exception()  # CancelledError when it was cancelled
        if error is None:
            return _as_response(future.result())
        if isinstance(error, SdcpProblem):
            return self._problem(error)
        log.error("a request failed", exc_info=error)
        return self._problem(InternalError())

    async def __call__(self, request: Request) -> Response:
        try:
            endpoint, groups = self._match(request)
            return _as_response(await endpoint(request, **groups))
        except SdcpProblem as problem:
            return self._problem(problem)
        except Exception:  # a bug: logged here, never a traceback on the wire
            log.exception("%s %s failed", request.method, request.path)
            return self._problem(InternalError())

    def _problem(self, problem: SdcpProblem) -> Response:
        if self.on_problem is not None:
            self.on_problem(problem)
        return problem_response(problem)

    def _match(self, request: Request) -> tuple[Endpoint, dict[str, str]]:
        path = request.path.lstrip("/")
        try:
            return self._table.match(request.method, path)
        except NoRoute as none:
            if none.allowed:
                raise MethodNotAllowed(f"{request.method} {path}") from None
            raise NotFound(path) from None


def routers_of(router: str | None) -> tuple[str, ...]:
    """The routers an instance serves: ``--router`` names one, or several, comma-separated,
    that share their routing records (docs/interpretations.md, "Routing records"); each gets
    its status and events."""
    return () if router is None else tuple(r.strip() for r in router.split(",") if r.strip())


async def to_every_router(router: str | None, call: Callable[[str], Awaitable[Any]]) -> None:
    """``call`` for each router at once; the first failure is raised after all were tried."""
    results = await asyncio.gather(*(call(r) for r in routers_of(router)), return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result


async def report_status_forever(report: Callable[[], Awaitable[None]], ttl_ms: int, router: str | None) -> None:
    """Report status more often than ``ttl_ms`` (§6.1); after a failed report (the router is
    starting or restarting) again soon, so that it learns of this instance at once."""
    while True:
        try:
            await report()
            delay = ttl_ms / 3000
        except Exception as exc:
            log.warning("status report to %s failed: %s", router, exc)
            delay = min(ttl_ms / 3000, 0.2)
        await asyncio.sleep(delay)


async def _healthy(request: Request) -> None:
    return None


def decode_body(cls: type[M], request: Request) -> M:
    return decode_message(cls, request.headers, request.body)


def decode_message(cls: type[M], headers: Mapping[str, str], body: bytes) -> M:
    """``body`` as a ``cls`` message (BadRequest unless its content type is SDCP's, or none)."""
    kind = headers.get("content-type")
    if kind is not None and kind != MEDIA_TYPE and kind.split(";")[0].strip() != MEDIA_TYPE:
        raise BadRequest(f"body must be {MEDIA_TYPE}")
    return cls.decode(body)  # type: ignore[attr-defined,no-any-return]


class SdcpClient:
    """Typed calls to every resource of Table 1 through one transport."""

    def __init__(self, transport: Transport, *, timeout: float | None = None, attempts: int = 4) -> None:
        self.transport = transport
        self.timeout = timeout
        self.attempts = attempts  # of an idempotent call whose connection was lost (_call_again)

    async def _call(self, base: str, method: str, path: str, message: Any = None, answer: type[M] | None = None,
                    query: Mapping[str, str] | None = None, timeout: float | None = None) -> M | None:
        body = b"" if message is None else message.encode()
        headers = {"content-type": MEDIA_TYPE} if message is not None else {}
        try:
            response = await self.transport.request(base, method, path, body=body, query=query, headers=headers,
                                                    timeout=timeout or self.timeout)
        except TransportError as exc:
            if isinstance(exc, TimeoutError):
                raise
            # No response: to the roles, as to the in-process transport, an unreachable peer (§6.9).
            raise ConnectionError(str(exc)) from exc
        if 200 <= response.status < 300:
            if answer is None or response.status == 204:
                return None
            return answer.decode(response.body)  # type: ignore[attr-defined,no-any-return]
        raise problem_from_response(response.status, problem_body(response))

    async def _call_again(self, base: str, method: str, path: str, message: Any, answer: type[M] | None = None) -> M | None:
        """A call its receiver answers the same when it is repeated (POST sessions is
        idempotent, §6.1; PUT drafter; a repeated assignment restarts the drafter from the same
        state): a connection lost before the answer is tried again a few times at once, so one
        cut connection neither fails a session's open nor leaves an assignment undelivered."""
        return await retrying(lambda _: self._call(base, method, path, message, answer), attempts=self.attempts,
                              transient=lambda exc: isinstance(exc, ConnectionError))

    # -- verifier ------------------------------------------------------------------------
    async def open_session(self, verifier: str, message: SessionOpen) -> SessionState:
        return await self._call_again(verifier, "POST", "sessions", message, SessionState)  # type: ignore[return-value]

    async def put_drafter(self, verifier: str, assignment: Assignment) -> SessionState:
        path = f"sessions/{session_path_id(assignment.session)}/drafter"
        return await self._call_again(verifier, "PUT", path, assignment, SessionState)  # type: ignore[return-value]

    async def propose(self, verifier: str, proposal: Proposal) -> Verdict:
        return await self._call(verifier, "POST", "proposals", proposal, Verdict)  # type: ignore[return-value]

    async def output(self, verifier: str, session: bytes, start: int, *, timeout: float | None = None) -> Output:
        path = f"sessions/{session_path_id(session)}/output"
        return await self._call(verifier, "GET", path, None, Output,  # type: ignore[return-value]
                                query={"from": str(start)}, timeout=timeout)

    async def policy(self, verifier: str, policy: Policy) -> SessionState:
        path = f"sessions/{session_path_id(policy.session)}/policy"
        return await self._call(verifier, "POST", path, policy, SessionState)  # type: ignore[return-value]

    async def cancel(self, verifier: str, session: bytes) -> None:
        """``DELETE sessions/{id}``: the router ends a session nobody reads any more (an
        extension to Table 1, docs/interpretations.md "Cancelling a session")."""
        await self._call(verifier, "DELETE", f"sessions/{session_path_id(session)}")

    async def drop_drafter(self, verifier: str, session: bytes) -> SessionState:
        """``DELETE sessions/{id}/drafter``: the router found no live drafter for a stalled
        session and the verifier decodes it itself (an extension to Table 1,
        docs/interpretations.md "Taking the drafter away")."""
        path = f"sessions/{session_path_id(session)}/drafter"
        return await self._call(verifier, "DELETE", path, None, SessionState)  # type: ignore[return-value]

    # -- drafter -------------------------------------------------------------------------
    async def assign(self, drafter: str, assignment: Assignment) -> None:
        await self._call_again(drafter, "POST", "assignments", assignment)

    # -- router --------------------------------------------------------------------------
    async def status(self, router: str, status: Status) -> None:
        await self._call(router, "PUT", f"instances/{instance_path_id(status.instance)}/status", status)

    async def event(self, router: str, event: Event) -> None:
        await self._call(router, "POST", "events", event)
