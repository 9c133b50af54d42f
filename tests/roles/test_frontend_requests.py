"""Requests of the front end read into sessions: fields become the session's spec."""

from __future__ import annotations

from typing import Any

from sdcp_fast.model.toy import EOS, encode
from sdcp_fast.protocol import Action, Sampling
from sdcp_fast.protocol.messages import RULE_GREEDY, RULE_SPECULATIVE
from sdcp_fast.roles.frontend import Frontend
from sdcp_fast.roles.frontend_requests import CompletionRequests
from sdcp_fast.roles.frontend_text import ToyWords
from sdcp_fast.roles.router import SessionSpec, serving_spec

PROMPT = "the verifier commits"


def reader(**changes: Any) -> CompletionRequests:
    settings: dict[str, Any] = dict(stop=(EOS,), defaults=serving_spec(), model="toy", max_tokens=16,
                                    max_tokens_limit=4096, max_prompt=32768, context=None, vocab=None,
                                    taken=lambda session: False)
    return CompletionRequests(ToyWords(), **{**settings, **changes})


def test_request_fields_become_the_session_spec() -> None:
    requests = reader(defaults=SessionSpec((), m_max=6))
    job = requests.job({"model": "toy", "prompt": PROMPT, "max_tokens": 7}, chat=False)
    assert job.spec.prompt == tuple(encode(PROMPT)) and job.spec.max_new == 7 and job.spec.m_max == 6
    assert job.spec.rule == RULE_GREEDY and job.spec.sampling is None and job.spec.stop == (EOS,)
    assert requests.job({"prompt": PROMPT, "temperature": 0}, chat=False).spec.rule == RULE_GREEDY
    sampled = requests.job({"prompt": PROMPT, "temperature": 0.7, "top_p": 0.9, "seed": 5, "stop": ["."]},
                           chat=False).spec
    assert sampled.rule == RULE_SPECULATIVE
    assert sampled.sampling == Sampling(temperature_milli=700, top_p_milli=900, seed=5)
    assert sampled.stop == (EOS, encode(".")[0])
    chat = requests.job({"messages": [{"role": "user", "content": PROMPT}], "max_completion_tokens": 3},
                        chat=True).spec
    assert chat.prompt == tuple(encode(PROMPT)) and chat.max_new == 3


def test_a_request_is_never_failed_for_its_drafts_by_default() -> None:
    """The front end's contract is the command-line tools' (one contract per job): reduce, switch,
    then the target's own decoding at any load and to the end; no `fail` on the ladder (the
    bench found requests failed over the network that decoded to the end in process)."""
    from sdcp_fast.deploy.local import spec_for

    frontend = Frontend(None, ToyWords(), stop=(EOS,), model="toy")  # type: ignore[arg-type]
    spec = frontend.requests.job({"prompt": PROMPT}, chat=False).spec
    assert spec.fallback == (Action.REDUCE, Action.SWITCH, Action.SELF_DECODE)
    assert (spec.self_load, spec.self_max) == (100, None)
    tools = spec_for(spec.prompt, max_new=spec.max_new)
    assert (tools.fallback, tools.self_load, tools.self_max) == (spec.fallback, spec.self_load, spec.self_max)
