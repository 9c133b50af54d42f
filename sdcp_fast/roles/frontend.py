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
tools holding a client-role certificate.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol, cast

from sdcp_fast.protocol import Action, Sampling, SdcpProblem
from sdcp_fast.protocol.messages import RULE_GREEDY, RULE_SPECULATIVE, Output
from sdcp_fast.protocol.peer import PeerRole
from sdcp_fast.protocol.routing import RoutedSession
from sdcp_fast.roles.router import RouterRole, SessionSpec, serving_spec
from sdcp_fast.roles.sse import DONE_EVENT, event
from sdcp_fast.transport.base import Request, Response

log = logging.getLogger("sdcp_fast.frontend")

JSON = "application/json"
SSE = "text/event-stream"


class TextTokenizer(Protocol):
    """What the front end needs of a tokenizer: text <-> ids and the model's chat template."""

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def chat(self, messages: Sequence[Mapping[str, str]]) -> str:
        """The prompt for ``messages`` ({"role", "content"}), ending where the assistant speaks."""
        ...


class ToyWords:
    """The toy model's word list (``sdcp_fast.model.toy``). It has no chat format: a chat is
    its messages' words in order."""

    def encode(self, text: str) -> list[int]:
        from sdcp_fast.model import toy

        return toy.encode(text)

    def decode(self, ids: Sequence[int]) -> str:
        from sdcp_fast.model import toy

        return toy.decode(ids)

    def chat(self, messages: Sequence[Mapping[str, str]]) -> str:
        return " ".join(m["content"] for m in messages)


class HFTokenizer:
    """A ``tokenizers.Tokenizer`` with ChatML (SmolLM2-Instruct, Qwen2.5;
    :func:`sdcp_fast.model.tokenizer.chat_prompt` for one user turn)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Sequence[int]) -> str:
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=True))

    def chat(self, messages: Sequence[Mapping[str, str]]) -> str:
        turns = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
        return turns + "<|im_start|>assistant\n"

    def stop_tokens(self) -> tuple[int, ...]:
        """The ids of ChatML's end of turn and the usual end-of-text tokens it knows."""
        names = ("<|im_end|>", "<|endoftext|>", "</s>", "<|eot_id|>")
        ids = (self.tokenizer.token_to_id(n) for n in names)
        return tuple(i for i in ids if i is not None)


class IncrementalDecoder:
    """Text of a growing token sequence, piece by piece. A piece is decoded together with the
    tokens before it (tokenizers join pieces with spaces or merge bytes across tokens) and
    held back while it ends in an incomplete UTF-8 sequence (U+FFFD), so no character is
    split or repeated; :meth:`flush` gives what is left at the end."""

    def __init__(self, tokenizer: TextTokenizer, skip: Sequence[int] = ()) -> None:
        self.tokenizer = tokenizer
        self.skip = frozenset(skip)
        self.ids: list[int] = []
        self._prefix = 0  # ids[_prefix:_read] were decoded already, as context
        self._read = 0

    def push(self, tokens: Sequence[int]) -> str:
        self.ids.extend(t for t in tokens if t not in self.skip)
        return self._advance(final=False)

    def flush(self) -> str:
        return self._advance(final=True)

    def _advance(self, final: bool) -> str:
        if self._read == len(self.ids):
            return ""
        before = self.tokenizer.decode(self.ids[self._prefix:self._read]) if self._read > self._prefix else ""
        text = self.tokenizer.decode(self.ids[self._prefix:])
        if not final and (text.endswith("\ufffd") or len(text) <= len(before)):
            return ""
        piece = text[len(before):]
        self._prefix, self._read = self._read, len(self.ids)
        return piece


class ApiError(Exception):
    """An OpenAI-style error: ``{"error": {"message", "type", "param", "code"}}``."""

    def __init__(self, status: int, message: str, *, kind: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.param, self.code = status, message, kind, param, code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}

    def response(self) -> Response:
        return Response(self.status, json.dumps(self.body()).encode(), {"content-type": JSON})


def _from_problem(problem: SdcpProblem) -> ApiError:
    kind = "invalid_request_error" if problem.status < 500 else "server_error"
    return ApiError(problem.status, problem.detail, kind=kind, code=problem.suffix)


@dataclass(frozen=True)
class _Job:
    spec: SessionSpec
    stream: bool
    usage_in_stream: bool
    created: int
    stop_texts: tuple[str, ...] = ()


class Frontend:
    """The endpoints; :func:`mount_frontend` adds them to a router's routes."""

    def __init__(self, router: RouterRole, tokenizer: TextTokenizer, *, stop: Sequence[int],
                 defaults: SessionSpec | None = None, model: str = "sdcp-fast",
                 max_tokens: int = 16, max_tokens_limit: int = 4096, max_prompt: int = 32768,
                 context: int | None = None, vocab: int | None = None) -> None:
        self.router = router
        self.tokenizer = tokenizer
        self.stop = tuple(stop)
        self.defaults = defaults or serving_spec()
        self.model = model
        self.max_tokens = max_tokens
        # A client cannot make one request hold a session for an unbounded generation or send
        # a prompt no target context holds (docs/security.md, "Limits").
        self.max_tokens_limit = max_tokens_limit
        self.max_prompt = max_prompt
        self.context = context  # the served model's context (prompt + new tokens); None: unbounded
        self.vocab = vocab
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
            job = self._job(_body(request), chat)
            routed = await self._open(job.spec)
        except ApiError as error:
            return error.response()
        except SdcpProblem as problem:
            return _from_problem(problem).response()
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

    async def _events(self, session: bytes, ident: str, job: _Job, chat: bool) -> AsyncGenerator[bytes, None]:
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
            yield event(_from_problem(problem).body())
        yield DONE_EVENT

    def _job(self, body: Mapping[str, Any], chat: bool) -> _Job:
        model = body.get("model", self.model)
        if model != self.model:
            raise ApiError(404, f"the model {model!r} does not exist; this server serves {self.model!r}",
                           param="model", code="model_not_found")
        n = body.get("n", 1)
        if n != 1 or isinstance(n, bool):
            raise ApiError(400, f"n = {n!r}: this server returns one choice per request (n = 1); send n requests "
                                "instead", param="n")
        if body.get("best_of", 1) != 1:
            raise ApiError(400, "best_of: only 1 is supported", param="best_of")
        max_new = body.get("max_completion_tokens", body.get("max_tokens"))
        max_new = self.max_tokens if max_new is None else max_new
        if not isinstance(max_new, int) or isinstance(max_new, bool) or max_new < 1:
            raise ApiError(400, "max_tokens must be a positive integer", param="max_tokens")
        if max_new > self.max_tokens_limit:
            raise ApiError(400, f"max_tokens is at most {self.max_tokens_limit}", param="max_tokens")
        where = "messages" if chat else "prompt"
        try:
            if chat:
                prompt = self.tokenizer.encode(self.tokenizer.chat(_messages(body.get("messages"))))
            else:
                prompt = self._prompt(body.get("prompt"))
        except (ValueError, KeyError, TypeError, UnicodeError) as exc:
            raise ApiError(400, f"the {where} cannot be tokenized: {exc}", param=where) from None
        if not prompt:
            raise ApiError(400, "the prompt encodes to no tokens", param=where)
        limit = self.max_prompt if self.context is None else min(self.max_prompt, self.context - max_new)
        if len(prompt) > limit:
            served = self.context if self.context is not None else self.max_prompt + max_new
            raise ApiError(400, f"This model's maximum context length is {served} tokens. However, you requested "
                                f"{len(prompt) + max_new} tokens ({len(prompt)} in the {where}, {max_new} in the "
                                "completion). Please reduce the length of the prompt or the completion.",
                           param=where, code="context_length_exceeded")
        stream = body.get("stream", False)
        if not isinstance(stream, bool):
            raise ApiError(400, "stream must be a boolean", param="stream")
        options = body.get("stream_options") or {}
        if not isinstance(options, dict):
            raise ApiError(400, "stream_options must be an object", param="stream_options")
        stops, texts = self._stops(body.get("stop"))
        spec = replace(self.defaults, prompt=tuple(prompt), max_new=max_new, stop=stops,
                       session=self._session(body.get("sdcp_session")), **self._rule(body))
        return _Job(spec, stream, options.get("include_usage") is True, int(time.time()), texts)

    def _session(self, value: Any) -> bytes | None:
        """``sdcp_session`` (ours, 32 hex digits): the session id, so that a seeded rule-2
        request repeats exactly (§6.4's randoms depend on it); absent: 128 random bits."""
        if value is None:
            return None
        try:
            session = bytes.fromhex(value) if isinstance(value, str) else b""
        except ValueError:
            session = b""
        if len(session) != 16:
            raise ApiError(400, "sdcp_session must be 32 hex digits", param="sdcp_session")
        if session in self.router.sessions:
            raise ApiError(409, "sdcp_session names a session this router already has", param="sdcp_session")
        return session

    def _prompt(self, prompt: Any) -> list[int]:
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt)
        vocab = self.vocab if self.vocab is not None else 1 << 32
        if isinstance(prompt, list) and prompt and all(
                isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab for t in prompt):
            return list(prompt)  # token ids, as the API allows
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            return self.tokenizer.encode(prompt[0])
        raise ApiError(400, f"prompt must be a string or a list of token ids below {vocab} (one prompt per "
                            "request)", param="prompt")

    def _stops(self, stop: Any) -> tuple[tuple[int, ...], tuple[str, ...]]:
        """The contract's stop tokens (the model's, plus each ``stop`` string that is exactly
        one token, so the verifier ends there, §4.1) and the stop strings, matched on the text."""
        strings = [stop] if isinstance(stop, str) else [] if stop is None else stop
        if not isinstance(strings, list) or not all(isinstance(s, str) and s for s in strings) or len(strings) > 4:
            raise ApiError(400, "stop must be a non-empty string or a list of at most 4 of them", param="stop")
        extra = []
        for text in strings:
            try:
                ids = self.tokenizer.encode(text)
            except (ValueError, KeyError, TypeError, UnicodeError):
                ids = []
            if len(ids) == 1 and self.tokenizer.decode(ids) == text:
                extra.append(ids[0])
        return tuple(dict.fromkeys((*self.stop, *extra))), tuple(dict.fromkeys(strings))

    @staticmethod
    def _rule(body: Mapping[str, Any]) -> dict[str, Any]:
        """Rule 1 (greedy, exact) unless a temperature above 0 asks for sampling (rule 2)."""
        temperature = _number(body, "temperature", 0.0, 2.0)
        top_p = _number(body, "top_p", 0.0, 1.0)
        seed = body.get("seed")
        if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 1 << 64):
            raise ApiError(400, "seed must be an integer from 0 to 2**64 - 1", param="seed")
        top_k = body.get("top_k")  # not OpenAI's, but common among compatible servers
        if top_k is not None and (not isinstance(top_k, int) or isinstance(top_k, bool) or not 0 <= top_k < 1 << 32):
            raise ApiError(400, "top_k must be an integer from 0 to 2**32 - 1", param="top_k")
        if not temperature:
            return {"rule": RULE_GREEDY, "sampling": None}
        sampling = Sampling(temperature_milli=round(temperature * 1000),
                            top_p_milli=None if top_p is None or top_p >= 1.0 else round(top_p * 1000),
                            top_k=top_k or None, seed=seed)
        return {"rule": RULE_SPECULATIVE, "sampling": sampling}


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


def _body(request: Request) -> Mapping[str, Any]:
    if request.headers.get("content-type", JSON).split(";")[0].strip() != JSON:
        raise ApiError(415, f"the body must be {JSON}")
    try:
        body = json.loads(request.body)
    except (ValueError, RecursionError) as exc:  # RecursionError: nested deeper than the parser goes
        raise ApiError(400, f"the body is not valid JSON: {type(exc).__name__}: {str(exc)[:200]}") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the body must be a JSON object")
    return body


def _messages(messages: Any) -> list[dict[str, str]]:
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "messages must be a non-empty list", param="messages")
    out = []
    for m in messages:
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, list):  # content parts: the text ones
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(content, str):
            raise ApiError(400, "each message needs a role and text content", param="messages")
        out.append({"role": m["role"], "content": content})
    return out


def _number(body: Mapping[str, Any], name: str, low: float, high: float) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise ApiError(400, f"{name} must be a number from {low} to {high}", param=name)
    return float(value)


def _usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _json(body: Mapping[str, Any], status: int = 200) -> Response:
    return Response(status, json.dumps(body).encode(), {"content-type": JSON})
