"""The router's OpenAI-compatible front end: ``POST v1/completions``, ``POST v1/chat/completions``
(non-streamed JSON, or ``stream: true`` as server-sent events) and ``GET v1/models``.

A request becomes a :class:`~sdcp_fast.roles.router.SessionSpec` (``max_tokens`` /
``max_completion_tokens`` -> max_new; ``temperature`` > 0 -> rule 2 with its sampling profile
and ``seed``, absent or 0 -> rule 1; the model's stop tokens, plus ``stop`` strings that are one
token each; ``sdcp_session``, 32 hex digits, fixes the session id so that a seeded rule-2
request repeats exactly), opened with :meth:`RouterRole.open`; the text is decoded
incrementally from :meth:`RouterRole.output`, which reads committed output by index and drops
output of an epoch lower than one already seen, so across a verifier fail-over a client never
sees a token twice or misses one. ``stop`` strings are matched on the text (the output ends
before the first), and a prompt that with ``max_tokens`` does not fit the model's context is
400 ``context_length_exceeded``. Errors are OpenAI-style JSON bodies (``{"error": {...}}``)
with their status; no input answers 5xx.

A session whose reader goes away (a stream closed early, a cancelled request, a stop string
reached) is cancelled at its verifier (:meth:`RouterRole.cancel`). :meth:`Frontend.handle`
serves the routes; :mod:`sdcp_fast.roles.frontend_server` is the client-facing listener
(HTTP/1.1, API keys), and :func:`mount_frontend` also puts them on the router's SDCP port for
tools holding a client-role certificate. Requests are read into sessions by
:mod:`sdcp_fast.roles.frontend_requests`; tokenizers and the incremental decoder are in
:mod:`sdcp_fast.roles.frontend_text`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from typing import Any, cast

from sdcp_fast.protocol import Action, SdcpProblem
from sdcp_fast.protocol.messages import Output
from sdcp_fast.protocol.peer import PeerRole
from sdcp_fast.protocol.routing import RoutedSession
from sdcp_fast.roles.frontend_requests import JSON, ApiError, CompletionRequests, Job, body_of, from_problem
from sdcp_fast.roles.frontend_text import IncrementalDecoder, TextTokenizer
from sdcp_fast.roles.router import RouterRole, SessionSpec, serving_spec
from sdcp_fast.roles.sse import DONE_EVENT, event
from sdcp_fast.transport.base import Request, Response

log = logging.getLogger("sdcp_fast.frontend")

SSE = "text/event-stream"


class Frontend:
    """The endpoints; :func:`mount_frontend` adds them to a router's routes."""

    def __init__(self, router: RouterRole, tokenizer: TextTokenizer, *, stop: Sequence[int],
                 defaults: SessionSpec | None = None, model: str = "sdcp-fast",
                 max_tokens: int = 16, max_tokens_limit: int = 4096, max_prompt: int = 32768,
                 context: int | None = None, vocab: int | None = None) -> None:
        self.router = router
        self.tokenizer = tokenizer
        self.stop = tuple(stop)
        self.model = model
        self.requests = CompletionRequests(
            tokenizer, stop=stop, defaults=defaults or serving_spec(), model=model, max_tokens=max_tokens,
            max_tokens_limit=max_tokens_limit, max_prompt=max_prompt, context=context, vocab=vocab,
            taken=lambda session: session in router.sessions)
        self._cancels: set[asyncio.Task[None]] = set()

    async def handle(self, request: Request) -> Response:
        """Any request under ``v1/``; whatever goes wrong answers an OpenAI-style error."""
        path = request.path.lstrip("/")
        rest = path[3:] if path.startswith("v1/") else None
        endpoint = {("GET", "models"): self.models, ("POST", "completions"): self.completions,
                    ("POST", "chat/completions"): self.chat_completions}.get((request.method, rest or ""))
        try:
            if rest is None:
                return ApiError(404, f"unknown endpoint {path}", code="unknown_url").response()
            if endpoint is None:
                return await self.unknown(request, rest)
            return await endpoint(request)
        except ApiError as error:
            return error.response()
        except Exception:  # a bug, never the client's input: logged, answered 500 in the API's shape
            log.exception("%s %s failed", request.method, path)
            return ApiError(500, "internal error", kind="server_error").response()

    def cancel_later(self, session: bytes, why: str) -> None:
        """Cancel ``session`` without waiting (from a stream's cleanup, which may be cancelled itself)."""
        task = asyncio.get_running_loop().create_task(self.router.cancel(session, why))
        self._cancels.add(task)
        task.add_done_callback(self._cancels.discard)

    # -- endpoints -----------------------------------------------------------------------

    async def models(self, request: Request) -> Response:
        return _json({"object": "list", "data": [
            {"id": self.model, "object": "model", "created": 0, "owned_by": "sdcp-fast"}]})

    async def completions(self, request: Request) -> Response:
        return await self._serve(request, chat=False)

    async def chat_completions(self, request: Request) -> Response:
        return await self._serve(request, chat=True)

    async def unknown(self, request: Request, rest: str) -> Response:
        known = {"models": "GET", "completions": "POST", "chat/completions": "POST"}
        if rest in known:
            return ApiError(405, f"{request.method} is not allowed on v1/{rest}; use {known[rest]}").response()
        return ApiError(404, f"unknown endpoint v1/{rest}", code="unknown_url").response()

    # -- one request ---------------------------------------------------------------------

    async def _serve(self, request: Request, *, chat: bool) -> Response:
        try:
            job = self.requests.job(body_of(request), chat)
            routed = await self._open(job.spec)
        except ApiError as error:
            return error.response()
        except SdcpProblem as problem:
            return from_problem(problem).response()
        session = routed.session
        ident = ("chatcmpl-" if chat else "cmpl-") + session.hex()
        log.info("session %s: %s, %d prompt tokens, max %d new, rule %d", session.hex(),
                 "chat" if chat else "completion", len(job.spec.prompt), job.spec.max_new, job.spec.rule)
        if job.stream:
            return Response(200, headers={"content-type": SSE, "cache-control": "no-cache"},
                            stream=_Events(self._events(session, ident, job, chat),
                                           lambda: self.cancel_later(session, "its reader went away before it began")))
        text, finish, count = [], "stop", 0
        try:
            async with contextlib.aclosing(self._pieces(session, job.stop_texts)) as pieces:
                async for piece, finished, n in pieces:
                    text.append(piece)
                    count = n
                    finish = finished or finish
        except ApiError as error:
            return error.response()
        choice: dict[str, Any] = {"index": 0, "finish_reason": finish}
        if chat:
            choice["message"] = {"role": "assistant", "content": "".join(text)}
        else:
            choice.update(text="".join(text), logprobs=None)
        return _json({"id": ident, "object": "chat.completion" if chat else "text_completion",
                      "created": job.created, "model": self.model, "choices": [choice],
                      "usage": _usage(len(job.spec.prompt), count)})

    async def _open(self, spec: SessionSpec) -> RoutedSession:
        """Open the session in a task of its own: a client that goes away meanwhile leaves the
        open to finish, and the session it made is cancelled then, not left running."""
        opening = asyncio.ensure_future(self.router.open(spec))
        try:
            return await asyncio.shield(opening)
        except asyncio.CancelledError:
            def opened(task: asyncio.Future[RoutedSession]) -> None:
                if not task.cancelled() and task.exception() is None:
                    self.cancel_later(task.result().session, "its client went away while it opened")

            opening.add_done_callback(opened)
            raise

    async def _pieces(self, session: bytes, stops: Sequence[str] = ()) -> AsyncGenerator[tuple[str, str | None, int], None]:
        """(text, finish_reason or None, tokens so far) as the session commits output. Text that
        could be the start of a stop string is held back until it is known not to be one; the
        output ends before the first stop string. Left before the session's last output (the
        reader went away, or a stop string was reached), the session is cancelled."""
        decoder = IncrementalDecoder(self.tokenizer, skip=self.stop)
        count, last, pending, ended = 0, None, "", False
        hold = max((len(s) for s in stops), default=1) - 1
        try:
            async with contextlib.aclosing(cast("AsyncGenerator[Output, None]", self.router.output(session))) as outputs:
                async for out in outputs:
                    count += len(out.tokens)
                    if out.tokens:
                        last = out.tokens[-1]
                    pending += decoder.push(out.tokens)
                    if out.final:
                        pending += decoder.flush()
                    cut = min((i for i in (pending.find(s) for s in stops) if i >= 0), default=-1)
                    if cut >= 0:
                        yield pending[:cut], "stop", count
                        return
                    if out.final:
                        ended = True
                        if out.finish == Action.FAIL:
                            log.warning("session %s: failed at %d output tokens (the contract's escalation ladder "
                                        "ended in fail)", session.hex(), count)
                            if pending:
                                yield pending, None, count
                            raise ApiError(500, "the session failed (its contract's escalation ladder ended in "
                                                "fail)", kind="server_error", code="sdcp-session-failed")
                        yield pending, "stop" if last in self.stop else "length", count
                        return
                    ready = len(pending) - hold
                    if ready > 0:
                        piece, pending = pending[:ready], pending[ready:]
                        yield piece, None, count
        finally:
            if not ended:
                self.cancel_later(session, "its reader went away before its end")

    async def _events(self, session: bytes, ident: str, job: Job, chat: bool) -> AsyncGenerator[bytes, None]:
        head = {"id": ident, "object": "chat.completion.chunk" if chat else "text_completion",
                "created": job.created, "model": self.model}

        def chunk(text: str | None, finish: str | None, first: bool = False) -> bytes:
            choice: dict[str, Any] = {"index": 0, "finish_reason": finish}
            if chat:
                delta: dict[str, str] = {"role": "assistant"} if first else {}
                if text is not None:
                    delta["content"] = text
                choice["delta"] = delta
            else:
                choice.update(text=text or "", logprobs=None)
            return event({**head, "choices": [choice]})

        count = 0
        try:
            if chat:
                yield chunk("", None, first=True)
            async with contextlib.aclosing(self._pieces(session, job.stop_texts)) as pieces:
                async for piece, finish, so_far in pieces:
                    count = so_far
                    if piece:
                        yield chunk(piece, None)
                    if finish is not None:
                        yield chunk(None if chat else "", finish)
            if job.usage_in_stream:
                yield event({**head, "choices": [], "usage": _usage(len(job.spec.prompt), count)})
        except ApiError as error:
            yield event(error.body())
        except SdcpProblem as problem:
            yield event(from_problem(problem).body())
        yield DONE_EVENT

class _Events:
    """A response's events; closed before its first event is asked for (the client went away
    before the body began), it calls ``abandoned``, which the generator's own cleanup would
    not: a generator that never started runs none of its code when closed."""

    def __init__(self, events: AsyncGenerator[bytes, None], abandoned: Callable[[], None]) -> None:
        self.events, self.abandoned, self.started = events, abandoned, False

    def __aiter__(self) -> _Events:
        return self

    async def __anext__(self) -> bytes:
        self.started = True
        return await self.events.__anext__()

    async def aclose(self) -> None:
        if not self.started:
            self.started = True
            self.abandoned()
        await self.events.aclose()


def mount_frontend(router: RouterRole, tokenizer: TextTokenizer, *, stop: Sequence[int],
                   defaults: SessionSpec | None = None, model: str = "sdcp-fast", max_tokens: int = 16,
                   context: int | None = None, vocab: int | None = None) -> Frontend:
    """The front end of ``router``, also served from its SDCP routes (``v1/...`` under its base
    URI) to peers with a client-role certificate (the harness, the demo, operators' tools);
    clients at large use :mod:`sdcp_fast.roles.frontend_server`.

    ``stop``: the model's stop tokens; ``defaults``: a spec whose contract fields (m_max,
    escalation, drafters, ...) every session takes; ``max_tokens``: when a request gives none;
    ``context``: the model's context length (prompt + output)."""
    frontend = Frontend(router, tokenizer, stop=stop, defaults=defaults, model=model, max_tokens=max_tokens,
                        context=context, vocab=vocab)

    async def client_only(request: Request, rest: str) -> Response:
        peer = request.peer
        if peer is not None and not peer.is_(PeerRole.CLIENT):
            # Other roles' certificates are for SDCP, not for running sessions on users' behalf.
            return ApiError(403, "the front end on this port takes client-role certificates only",
                            kind="permission_error", code="forbidden").response()
        return await frontend.handle(request)

    for method in ("GET", "POST", "PUT", "DELETE"):
        router.routes.add(method, r"(?P<rest>v1/.*)", client_only)
    return frontend


def _usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _json(body: Mapping[str, Any], status: int = 200) -> Response:
    return Response(status, json.dumps(body).encode(), {"content-type": JSON})
