"""Bad requests to the front end (roles/frontend_requests.py) are 400s that say what is wrong
with the request (which field, what was expected), as OpenAI's do: never Python's own words
(an exception's name, ``sys.set_int_max_str_digits``, a tokenizer's internal types)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from sdcp_fast.roles.frontend_requests import ApiError, CompletionRequests, body_of
from sdcp_fast.roles.frontend_text import HFTokenizer
from sdcp_fast.roles.router import serving_spec
from sdcp_fast.transport.base import Request

from .test_frontend_requests import reader

INTERNALS = ("Error", "sys.", "TextInputSequence", "Traceback", "str'", "NoneType")


def hf_reader() -> CompletionRequests:
    """A request reader over a ``tokenizers`` tokenizer, as a served checkpoint has."""
    tok = Tokenizer(models.WordLevel({"hello": 0, "world": 1, "[UNK]": 2}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return CompletionRequests(HFTokenizer(tok), stop=(), defaults=serving_spec(), model="m", max_tokens=4,
                              max_tokens_limit=64, max_prompt=64, context=None, vocab=3, taken=lambda _: False)


def refusal(read: CompletionRequests, body: bytes | dict[str, Any], chat: bool = False) -> ApiError:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    with pytest.raises(ApiError) as caught:
        read.job(body_of(Request("POST", "v1/completions", body=raw, headers={"content-type": "application/json"})),
                 chat)
    return caught.value


def test_an_unknown_chat_role_is_400_naming_the_message() -> None:
    error = refusal(reader(), {"messages": [{"role": "user", "content": "the"}, {"role": "wizard", "content": "x"}]},
                    chat=True)
    assert error.status == 400 and error.param == "messages[1].role"
    assert "wizard" in error.message and "user" in error.message


def test_openai_roles_are_taken() -> None:
    messages = [{"role": r, "content": "the verifier"} for r in ("system", "developer", "user", "assistant")]
    job = reader().job({"messages": messages}, True)
    assert job.spec.prompt


@pytest.mark.parametrize("body, says", [
    (b"[" * 100_000 + b"]" * 100_000, "too deeply"),
    (b'{"prompt": "the", "max_tokens": ' + b"7" * 5000 + b"}", "too many digits"),
    (b'{"prompt": "the" ', "not valid JSON"),
    (b'{"prompt": "\xff"}', "UTF-8"),
])
def test_unreadable_bodies_say_what_is_wrong_in_the_request_s_words(body: bytes, says: str) -> None:
    error = refusal(reader(), body)
    assert error.status == 400 and says in error.message
    assert not any(word in error.message for word in INTERNALS), error.message


@pytest.mark.parametrize("body, chat, param", [
    ({"prompt": "hello \ud800 world"}, False, "prompt"),
    ({"prompt": ["hello \udfff"]}, False, "prompt"),
    ({"messages": [{"role": "user", "content": "hello \ud800"}]}, True, "messages[0].content"),
    ({"messages": [{"role": "user", "content": 3}]}, True, "messages[0].content"),
    ({"messages": ["hello"]}, True, "messages"),
])
def test_text_a_tokenizer_cannot_take_is_400_naming_the_field(body: dict[str, Any], chat: bool, param: str) -> None:
    error = refusal(hf_reader(), body, chat)
    assert error.status == 400 and error.param == param
    assert not any(word in error.message for word in INTERNALS), error.message
