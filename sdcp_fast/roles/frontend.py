"""The router's OpenAI-compatible front end: ``POST v1/completions``, ``POST v1/chat/completions``
(non-streamed JSON, or ``stream: true`` as server-sent events) and ``GET v1/models``.

A request becomes a :class:`~sdcp_fast.roles.router.SessionSpec` (``max_tokens`` -> max_new;
``temperature`` > 0 -> rule 2 with its sampling profile, absent or 0 -> rule 1; the model's
stop tokens, plus ``stop`` strings that are one token each; ``sdcp_session``, 32 hex digits,
fixes the session id so that a seeded rule-2 request repeats exactly), opened with
:meth:`RouterRole.open`; the text is decoded incrementally from
:meth:`RouterRole.output`, which reads committed output by index and drops output of an epoch
lower than one already seen, so across a verifier fail-over a client never sees a token twice
or misses one. Errors are OpenAI-style JSON bodies (``{"error": {...}}``) with their status.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from sdcp_fast.protocol import Action, Sampling, SdcpProblem
from sdcp_fast.protocol.messages import RULE_GREEDY, RULE_SPECULATIVE
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


class Frontend:
    """The endpoints; :func:`mount_frontend` adds them to a router's routes."""

    def __init__(self, router: RouterRole, tokenizer: TextTokenizer, *, stop: Sequence[int],
                 defaults: SessionSpec | None = None, model: str = "sdcp-fast",
                 max_tokens: int = 16, max_tokens_limit: int = 4096, max_prompt: int = 32768) -> None:
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
            routed = await self.router.open(job.spec)
        except ApiError as error:
            return error.response()
        except SdcpProblem as problem:
            return _from_problem(problem).response()
        session = routed.session
        ident = ("chatcmpl-" if chat else "cmpl-") + session.hex()
        log.info("session %s: %s, %d prompt tokens, max %d new, rule %d", session.hex()[:8],
                 "chat" if chat else "completion", len(job.spec.prompt), job.spec.max_new, job.spec.rule)
        if job.stream:
            return Response(200, headers={"content-type": SSE, "cache-control": "no-cache"},
                            stream=self._events(session, ident, job, chat))
        text, finish, count = [], "stop", 0
        try:
            async for piece, finished, n in self._pieces(session):
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

    async def _pieces(self, session: bytes) -> AsyncIterator[tuple[str, str | None, int]]:
        """(text, finish_reason or None, tokens so far) as the session commits output."""
        decoder = IncrementalDecoder(self.tokenizer, skip=self.stop)
        count, last = 0, None
        async for out in self.router.output(session):
            count += len(out.tokens)
            if out.tokens:
                last = out.tokens[-1]
            piece = decoder.push(out.tokens)
            if out.final:
                piece += decoder.flush()
                if out.finish == Action.FAIL:
                    if piece:
                        yield piece, None, count
                    raise ApiError(500, "the session failed (its contract's escalation ladder ended in fail)",
                                   kind="server_error", code="sdcp-session-failed")
                yield piece, "stop" if last in self.stop else "length", count
                return
            if piece:
                yield piece, None, count

    async def _events(self, session: bytes, ident: str, job: _Job, chat: bool) -> AsyncIterator[bytes]:
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
            async for piece, finish, so_far in self._pieces(session):
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
        if body.get("n", 1) != 1:
            raise ApiError(400, "only n = 1 is supported", param="n")
        if chat:
            prompt = self.tokenizer.encode(self.tokenizer.chat(_messages(body.get("messages"))))
        else:
            prompt = self._prompt(body.get("prompt"))
        if not prompt:
            raise ApiError(400, "the prompt encodes to no tokens", param="messages" if chat else "prompt")
        if len(prompt) > self.max_prompt:
            raise ApiError(400, f"the prompt has {len(prompt)} tokens, at most {self.max_prompt} are served",
                           param="messages" if chat else "prompt", code="context_length_exceeded")
        max_new = body.get("max_completion_tokens", body.get("max_tokens"))
        max_new = self.max_tokens if max_new is None else max_new
        if not isinstance(max_new, int) or isinstance(max_new, bool) or max_new < 1:
            raise ApiError(400, "max_tokens must be a positive integer", param="max_tokens")
        if max_new > self.max_tokens_limit:
            raise ApiError(400, f"max_tokens is at most {self.max_tokens_limit}", param="max_tokens")
        stream = body.get("stream", False)
        if not isinstance(stream, bool):
            raise ApiError(400, "stream must be a boolean", param="stream")
        options = body.get("stream_options") or {}
        spec = replace(self.defaults, prompt=tuple(prompt), max_new=max_new, stop=self._stops(body.get("stop")),
                       session=self._session(body.get("sdcp_session")), **self._rule(body))
        return _Job(spec, stream, bool(isinstance(options, dict) and options.get("include_usage")),
                    int(time.time()))

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
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) and t >= 0 for t in prompt):
            return list(prompt)  # token ids, as the API allows
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            return self.tokenizer.encode(prompt[0])
        raise ApiError(400, "prompt must be a string or a list of token ids (one prompt per request)",
                       param="prompt")

    def _stops(self, stop: Any) -> tuple[int, ...]:
        """The model's stop tokens, plus each ``stop`` string that is exactly one token (a
        contract stops on tokens, §4.1; longer stop strings would need text matching)."""
        strings = [stop] if isinstance(stop, str) else stop or []
        if not isinstance(strings, list) or not all(isinstance(s, str) for s in strings):
            raise ApiError(400, "stop must be a string or a list of strings", param="stop")
        extra = []
        for text in strings:
            ids = self.tokenizer.encode(text)
            if len(ids) != 1:
                raise ApiError(400, f"stop sequence {text!r} is not a single token; only single-token stops "
                                    "are supported", param="stop")
            extra.append(ids[0])
        return tuple(dict.fromkeys((*self.stop, *extra)))

    @staticmethod
    def _rule(body: Mapping[str, Any]) -> dict[str, Any]:
        """Rule 1 (greedy, exact) unless a temperature above 0 asks for sampling (rule 2)."""
        temperature = _number(body, "temperature", 0.0, 2.0)
        top_p = _number(body, "top_p", 0.0, 1.0)
        seed = body.get("seed")
        if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool) or seed < 0):
            raise ApiError(400, "seed must be a non-negative integer", param="seed")
        top_k = body.get("top_k")  # not OpenAI's, but common among compatible servers
        if top_k is not None and (not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 0):
            raise ApiError(400, "top_k must be a non-negative integer", param="top_k")
        if not temperature:
            return {"rule": RULE_GREEDY, "sampling": None}
        sampling = Sampling(temperature_milli=round(temperature * 1000),
                            top_p_milli=None if top_p is None or top_p >= 1.0 else round(top_p * 1000),
                            top_k=top_k or None, seed=seed)
        return {"rule": RULE_SPECULATIVE, "sampling": sampling}


def mount_frontend(router: RouterRole, tokenizer: TextTokenizer, *, stop: Sequence[int],
                   defaults: SessionSpec | None = None, model: str = "sdcp-fast", max_tokens: int = 16) -> Frontend:
    """Serve the OpenAI-compatible API from ``router``'s routes (``v1/...`` under its base URI).

    ``stop``: the model's stop tokens; ``defaults``: a spec whose contract fields (m_max,
    escalation, drafters, ...) every session takes; ``max_tokens``: when a request gives none."""
    frontend = Frontend(router, tokenizer, stop=stop, defaults=defaults, model=model, max_tokens=max_tokens)
    router.routes.add("GET", r"v1/models", frontend.models)
    router.routes.add("POST", r"v1/completions", frontend.completions)
    router.routes.add("POST", r"v1/chat/completions", frontend.chat_completions)
    for method in ("GET", "POST", "PUT", "DELETE"):
        router.routes.add(method, r"v1/(?P<rest>.*)", frontend.unknown)
    return frontend


def _body(request: Request) -> Mapping[str, Any]:
    if request.headers.get("content-type", JSON).split(";")[0].strip() != JSON:
        raise ApiError(415, f"the body must be {JSON}")
    try:
        body = json.loads(request.body)
    except ValueError as exc:
        raise ApiError(400, f"the body is not valid JSON: {exc}") from None
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
