"""Requests of the OpenAI-compatible front end (:mod:`sdcp_fast.roles.frontend`) read into
sessions: a body becomes a :class:`Job` (a :class:`~sdcp_fast.roles.router.SessionSpec` and how
to answer), checked against the front end's limits; anything wrong is an :class:`ApiError`, an
OpenAI-style error body with its status.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from sdcp_fast.protocol import Sampling, SdcpProblem
from sdcp_fast.protocol.messages import RULE_GREEDY, RULE_SPECULATIVE
from sdcp_fast.roles.frontend_text import TextTokenizer
from sdcp_fast.roles.router import SessionSpec
from sdcp_fast.transport.base import Request, Response

JSON = "application/json"
RETRY_AFTER_S = 1  # seconds a client waits before asking again after a 503


class ApiError(Exception):
    """An OpenAI-style error: ``{"error": {"message", "type", "param", "code"}}``."""

    def __init__(self, status: int, message: str, *, kind: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.param, self.code = status, message, kind, param, code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}

    def response(self) -> Response:
        headers = {"content-type": JSON}
        if self.status == 503:  # what is missing (a verifier, etcd's quorum) comes back by itself
            headers["retry-after"] = str(RETRY_AFTER_S)
        return Response(self.status, json.dumps(self.body()).encode(), headers)


def from_problem(problem: SdcpProblem) -> ApiError:
    kind = "invalid_request_error" if problem.status < 500 else "server_error"
    return ApiError(problem.status, problem.detail, kind=kind, code=problem.suffix)


@dataclass(frozen=True)
class Job:
    spec: SessionSpec
    stream: bool
    usage_in_stream: bool
    created: int
    stop_texts: tuple[str, ...] = ()


class CompletionRequests:
    """The front end's limits and defaults, and what turns one request body into a :class:`Job`."""

    def __init__(self, tokenizer: TextTokenizer, *, stop: Sequence[int], defaults: SessionSpec,
                 model: str, max_tokens: int, max_tokens_limit: int, max_prompt: int,
                 context: int | None, vocab: int | None, taken: Callable[[bytes], bool]) -> None:
        self.tokenizer = tokenizer
        self.stop = tuple(stop)
        self.defaults = defaults
        self.model = model
        self.max_tokens = max_tokens
        # A client cannot make one request hold a session for an unbounded generation or send
        # a prompt no target context holds (docs/security.md, "Limits").
        self.max_tokens_limit = max_tokens_limit
        self.max_prompt = max_prompt
        self.context = context  # the served model's context (prompt + new tokens); None: unbounded
        self.vocab = vocab
        self.taken = taken  # whether a session id is already in use

    def job(self, body: Mapping[str, Any], chat: bool, *, resuming: bool = False) -> Job:
        """The job of ``body``; ``resuming``: a request sent again to resume its stream, whose
        ``sdcp_session`` names the session it made (taken, then, by design)."""
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
        except (ValueError, KeyError, TypeError, UnicodeError):
            # The tokenizer's own words name its internals, not the request's fault.
            raise ApiError(400, f"the {where} cannot be tokenized: it must be text (a JSON string of valid "
                                "Unicode)", param=where) from None
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
                       session=self._session(body.get("sdcp_session"), resuming), **self._rule(body))
        return Job(spec, stream, options.get("include_usage") is True, int(time.time()), texts)

    def _session(self, value: Any, resuming: bool = False) -> bytes | None:
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
        if not resuming and self.taken(session):
            raise ApiError(409, "sdcp_session names a session this router already has", param="sdcp_session")
        return session

    def _prompt(self, prompt: Any) -> list[int]:
        if isinstance(prompt, str):
            return self.tokenizer.encode(_text(prompt, "prompt"))
        vocab = self.vocab if self.vocab is not None else 1 << 32
        if isinstance(prompt, list) and prompt and all(
                isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab for t in prompt):
            return list(prompt)  # token ids, as the API allows
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            return self.tokenizer.encode(_text(prompt[0], "prompt"))
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


def body_of(request: Request) -> Mapping[str, Any]:
    if request.headers.get("content-type", JSON).split(";")[0].strip() != JSON:
        raise ApiError(415, f"the body must be {JSON}")
    try:
        body = json.loads(request.body)
    except json.JSONDecodeError as exc:
        raise ApiError(400, f"the body is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") \
            from None
    except RecursionError:  # nested deeper than the parser goes
        raise ApiError(400, "the body nests arrays or objects too deeply to be read") from None
    except UnicodeError:
        raise ApiError(400, "the body is not valid UTF-8") from None
    except ValueError:  # an integer of more digits than Python converts (sys.int_info)
        raise ApiError(400, "the body holds a number with too many digits (integers have at most "
                            f"{sys.get_int_max_str_digits()})") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the body must be a JSON object")
    return body


ROLES = ("system", "developer", "user", "assistant", "tool")  # OpenAI's chat roles


def _messages(messages: Any) -> list[dict[str, str]]:
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "messages must be a non-empty list", param="messages")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise ApiError(400, f"messages[{i}] must be an object with a role and content", param="messages")
        role = m.get("role")
        if role not in ROLES:
            raise ApiError(400, f"messages[{i}].role must be one of {', '.join(ROLES)}; got {str(role)[:40]!r}",
                           param=f"messages[{i}].role")
        content = m.get("content")
        if isinstance(content, list):  # content parts: the text ones
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text"
                              and isinstance(p.get("text", ""), str))
        if not isinstance(content, str):
            raise ApiError(400, f"messages[{i}].content must be a string or a list of text parts",
                           param=f"messages[{i}].content")
        out.append({"role": "system" if role == "developer" else role,
                    "content": _text(content, f"messages[{i}].content")})
    return out


def _text(text: str, param: str) -> str:
    """``text`` if a tokenizer can take it; a lone surrogate (``"\\ud800"`` in JSON) is no character."""
    try:
        text.encode()
    except UnicodeEncodeError as exc:
        raise ApiError(400, f"{param} is not valid Unicode text: a lone surrogate (U+{ord(text[exc.start]):04X}) at "
                            f"character {exc.start}", param=param) from None
    return text


def _number(body: Mapping[str, Any], name: str, low: float, high: float) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise ApiError(400, f"{name} must be a number from {low} to {high}", param=name)
    return float(value)
