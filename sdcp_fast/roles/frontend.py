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

Streamed events carry ids (:func:`~sdcp_fast.roles.sse.event_id`, ``<session>:<index>``: the
text so far is that of the first ``index`` output tokens). The same request sent again with
``Last-Event-ID`` resumes the stream after that event, at this router or at any router sharing
its routing records, which adopts the session (:meth:`RouterRole.adopt`): the text comes from
the committed output, read again from index 0 to rebuild the decoder, and only what follows
the index is sent.

A session whose reader goes away (a stream closed early, a cancelled request, a stop string
reached) is cancelled at its verifier (:meth:`RouterRole.cancel`); one whose router dies is not,
so that its client can resume it elsewhere. :meth:`Frontend.handle`
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
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping, Sequence
from typing import Any, cast

from sdcp_fast.protocol import Action, SdcpProblem
from sdcp_fast.protocol.messages import Output
from sdcp_fast.protocol.peer import PeerRole
from sdcp_fast.protocol.routing import RoutedSession
from sdcp_fast.roles.frontend_requests import JSON, ApiError, CompletionRequests, Job, body_of, from_problem
from sdcp_fast.roles.frontend_text import IncrementalDecoder, TextTokenizer
from sdcp_fast.roles.router import RouterRole, SessionSpec, serving_spec
from sdcp_fast.roles.sse import DONE_EVENT, event, event_id, parse_event_id
from sdcp_fast.transport.base import Request, Response

log = logging.getLogger("sdcp_fast.frontend")

SSE = "text/event-stream"
RESUME_PROBE_S = 5.0  # how long a resume waits to learn whether an ended session's output is still served


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
        resume = request.headers.get("last-event-id")
        try:
            body = body_of(request)
            job = self.requests.job(body, chat, resuming=resume is not None)
            if resume is not None:
                return await self._resume(job, resume, chat)
            routed = await self._open(job.spec, dict(body))
        except ApiError as error:
            return error.response()
        except SdcpProblem as problem:
            return from_problem(problem).response()
        session = routed.session
        ident = ("chatcmpl-" if chat else "cmpl-") + session.hex()
        log.info("session %s: %s, %d prompt tokens, max %d new, rule %d", session.hex(),
                 "chat" if chat else "completion", len(job.spec.prompt), job.spec.max_new, job.spec.rule)
        if job.stream:
            return self._stream(session, ident, job, chat)
        text, finish, count = [], "stop", 0
        try:
            async with contextlib.aclosing(self._pieces(session, job.stop_texts)) as pieces:
                async for piece, finished, n, _ in pieces:
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

    def _stream(self, session: bytes, ident: str, job: Job, chat: bool) -> Response:
        async def abandoned() -> None:
            self.cancel_later(session, "its reader went away before it began")

        pieces = self._pieces(session, job.stop_texts)
        return Response(200, headers={"content-type": SSE, "cache-control": "no-cache"},
                        stream=_Events(self._events(session, ident, job, chat, pieces), abandoned))

    def _stop_texts(self, request: dict[str, Any] | None, chat: bool) -> tuple[str, ...] | None:
        """The stop strings of the request a session was opened for (None: not known): the text a
        resumed stream holds back depends on them, so a resume must name the same."""
        if request is None:
            return None
        try:
            return self.requests.job(request, chat, resuming=True).stop_texts
        except ApiError:
            return None

    async def _resume(self, job: Job, last: str, chat: bool) -> Response:
        """The rest of the stream after the event ``last`` names (``Last-Event-ID``)."""
        if not job.stream:
            raise ApiError(400, "Last-Event-ID resumes a stream; this request has stream false", param="stream")
        try:
            session, index = parse_event_id(last)
        except ValueError:
            raise ApiError(400, "Last-Event-ID is not an event id of this API (<32 hex digits>:<index>)",
                           code="invalid_last_event_id") from None
        try:
            routed = await self.router.adopt(session)
        except (ConnectionError, TimeoutError, OSError) as exc:  # the MLC holding the records is away
            log.warning("session %s: resume: routing record not readable: %s", session.hex(), exc)
            raise ApiError(503, "the session's routing record cannot be read now; retry later", kind="server_error",
                           code="sdcp-busy") from None
        if routed is None:
            raise ApiError(404, f"no live session {session.hex()} to resume: it is unknown or it finished",
                           code="session_not_found")
        if (tuple(routed.prompt) != tuple(job.spec.prompt) or routed.contract.max_new != job.spec.max_new
                or self._stop_texts(routed.request, chat) not in (None, job.stop_texts)):
            raise ApiError(409, "Last-Event-ID names a session of another request; send the same request again",
                           code="last_event_id_mismatch")
        ident = ("chatcmpl-" if chat else "cmpl-") + session.hex()
        if index is not None and index > routed.contract.max_new:
            raise ApiError(400, f"Last-Event-ID names output token {index}; the session makes at most "
                                f"{routed.contract.max_new}", code="invalid_last_event_id")
        if index is None:  # the client has the whole text: only the close is left
            return Response(200, headers={"content-type": SSE, "cache-control": "no-cache"}, stream=_once(DONE_EVENT))
        if routed.done:  # ended: resumable while its verifier still serves the output
            try:
                await self.router.client.output(routed.verifier, session, 0, timeout=RESUME_PROBE_S)
            except (SdcpProblem, ConnectionError, TimeoutError, OSError):
                raise ApiError(410, f"session {session.hex()} ended and its output is no longer served",
                               code="session_finished") from None
        # Read up to the index before answering, so that an index beyond the output is a 400,
        # not an error event in a stream that already said 200.
        pieces = self._pieces(session, job.stop_texts, index)
        try:
            await pieces.__anext__()
        except BaseException:
            await pieces.aclose()
            raise
        log.info("session %s: stream resumed after output token %d", session.hex(), index)
        return Response(200, headers={"content-type": SSE, "cache-control": "no-cache"},
                        stream=_Events(self._events(session, ident, job, chat, pieces, resumed=True),
                                       pieces.aclose))

    async def _open(self, spec: SessionSpec, request: dict[str, Any] | None = None) -> RoutedSession:
        """Open the session in a task of its own: a client that goes away meanwhile leaves the
        open to finish, and the session it made is cancelled then, not left running."""
        opening = asyncio.ensure_future(self.router.open(spec, request))
        try:
            return await asyncio.shield(opening)
        except asyncio.CancelledError:
            def opened(task: asyncio.Future[RoutedSession]) -> None:
                if not task.cancelled() and task.exception() is None:
                    self.cancel_later(task.result().session, "its client went away while it opened")

            opening.add_done_callback(opened)
            raise

    async def _pieces(self, session: bytes, stops: Sequence[str] = (), start: int = 0,
                      ) -> AsyncGenerator[tuple[str, str | None, int, int | None], None]:
        """(text, finish_reason or None, tokens so far, index) as the session commits output,
        where the text given so far is exactly that of the first ``index`` output tokens (None
        with text cut before a stop string). Text that could be the start of a stop string is
        held back, in whole decoded pieces, until it is known not to be one; the output ends
        before the first stop string. From ``start`` on: the output before it only feeds the
        decoder, then ``("", None, start, start)`` says so; a session that ends before
        ``start`` is 400 ``invalid_last_event_id``. Left
        before the session's last output (the reader went away, or a stop string was
        reached), the session is cancelled."""
        decoder = IncrementalDecoder(self.tokenizer, skip=self.stop)
        count, last, ended = 0, None, False
        held: list[tuple[int, str]] = []  # decoded pieces not sent yet, with the index each ends at
        hold = max((len(s) for s in stops), default=1) - 1
        try:
            async with contextlib.aclosing(cast("AsyncGenerator[Output, None]", self.router.output(session))) as outputs:
                async for out in outputs:
                    tokens = list(out.tokens)
                    if count < start:  # already sent: the decoder learns them, nothing is given
                        primed = tokens[:start - count]
                        decoder.push(primed)
                        count += len(primed)
                        last = primed[-1] if primed else last
                        tokens = tokens[len(primed):]
                        if count < start:
                            if out.final:
                                ended = True  # nothing to cancel: the session is still resumable from a right id
                                raise ApiError(400, f"Last-Event-ID names output token {start}; the session has "
                                                    f"{count}", code="invalid_last_event_id")
                            continue
                        yield "", None, count, count  # primed: the resume is known to be good
                    count += len(tokens)
                    if tokens:
                        last = tokens[-1]
                    piece = decoder.push(tokens)
                    if out.final:
                        piece += decoder.flush()
                    if piece:
                        held.append((count, piece))
                    pending = "".join(p for _, p in held)
                    cut = min((i for i in (pending.find(s) for s in stops) if i >= 0), default=-1)
                    if cut >= 0:
                        yield pending[:cut], "stop", count, None
                        return
                    if out.final:
                        ended = True
                        if out.finish == Action.FAIL:
                            log.warning("session %s: failed at %d output tokens (the contract's escalation ladder "
                                        "ended in fail)", session.hex(), count)
                            if pending:
                                yield pending, None, count, count
                            raise ApiError(500, "the session failed (its contract's escalation ladder ended in "
                                                "fail)", kind="server_error", code="sdcp-session-failed")
                        # The last text keeps its index: a client cut off after it resumes to the finish.
                        yield pending, "stop" if last in self.stop else "length", count, count
                        return
                    sent, index, left = [], None, len(pending)
                    while held and left - len(held[0][1]) >= hold:
                        index, piece = held.pop(0)
                        sent.append(piece)
                        left -= len(piece)
                    if sent:
                        yield "".join(sent), None, count, index
        finally:
            if not ended:
                self.cancel_later(session, "its reader went away before its end")

    async def _events(self, session: bytes, ident: str, job: Job, chat: bool,
                      pieces: AsyncGenerator[tuple[str, str | None, int, int | None], None], *,
                      resumed: bool = False) -> AsyncGenerator[bytes, None]:
        head = {"id": ident, "object": "chat.completion.chunk" if chat else "text_completion",
                "created": job.created, "model": self.model}
        end = event_id(session, None)

        def chunk(text: str | None, finish: str | None, id: str, first: bool = False) -> bytes:
            choice: dict[str, Any] = {"index": 0, "finish_reason": finish}
            if chat:
                delta: dict[str, str] = {"role": "assistant"} if first else {}
                if text is not None:
                    delta["content"] = text
                choice["delta"] = delta
            else:
                choice.update(text=text or "", logprobs=None)
            return event({**head, "choices": [choice]}, id)

        count = 0
        try:
            if chat and not resumed:
                yield chunk("", None, event_id(session, 0), first=True)
            async with contextlib.aclosing(pieces):
                async for piece, finish, so_far, index in pieces:
                    count = so_far
                    if index is None and finish is not None:
                        # Cut before a stop string: no token boundary, so the text goes with its
                        # finish in one event, which a client cannot miss half of.
                        yield chunk(piece if piece or not chat else None, finish, end)
                        continue
                    if piece:
                        yield chunk(piece, None, end if index is None else event_id(session, index))
                    if finish is not None:
                        yield chunk(None if chat else "", finish, end)
            if job.usage_in_stream:
                yield event({**head, "choices": [], "usage": _usage(len(job.spec.prompt), count)}, end)
        except ApiError as error:
            yield event(error.body())
        except SdcpProblem as problem:
            yield event(from_problem(problem).body())
        yield DONE_EVENT


class _Events:
    """A response's events; closed before its first event is asked for (the client went away
    before the body began), it awaits ``abandoned``, which the generator's own cleanup would
    not: a generator that never started runs none of its code when closed."""

    def __init__(self, events: AsyncGenerator[bytes, None], abandoned: Callable[[], Awaitable[None]]) -> None:
        self.events, self.abandoned, self.started = events, abandoned, False

    def __aiter__(self) -> _Events:
        return self

    async def __anext__(self) -> bytes:
        self.started = True
        return await self.events.__anext__()

    async def aclose(self) -> None:
        if not self.started:
            self.started = True
            await self.abandoned()
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


async def _once(data: bytes) -> AsyncGenerator[bytes, None]:
    yield data


def _usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _json(body: Mapping[str, Any], status: int = 200) -> Response:
    return Response(status, json.dumps(body).encode(), {"content-type": JSON})
