"""The router's OpenAI-compatible front end: requests become sessions of the in-process roles
(toy model), text is decoded piece by piece, errors are OpenAI-style; and the official
``openai`` client streams a completion over HTTP/2 + mutual TLS."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from sdcp_fast.deploy.local import Deployment, Engine, model_digest
from sdcp_fast.model.interfaces import ScoreRequest
from sdcp_fast.model.toy import EOS, ToyDrafter, ToyTarget, decode, encode
from sdcp_fast.protocol import Action
from sdcp_fast.protocol.messages import RULE_SPECULATIVE, Output
from sdcp_fast.protocol.peer import PeerRole
from sdcp_fast.roles.frontend import Frontend, mount_frontend
from sdcp_fast.roles.frontend_text import ToyWords
from sdcp_fast.roles.router import SessionSpec
from sdcp_fast.roles.sse import DONE, messages
from sdcp_fast.store import embedded
from sdcp_fast.transport import loop
from sdcp_fast.transport.base import Request, Response

PROMPT = "the verifier commits"


def greedy(target: ToyTarget, prompt: Sequence[int], n: int) -> list[int]:
    out: list[int] = []
    for _ in range(n):
        row = target.score([ScoreRequest(b"g" * 16, [*prompt, *out], [])])[0][0]
        out.append(int(torch.argmax(row)))
        if out[-1] == EOS:
            break
    return out


@contextlib.asynccontextmanager
async def deployment(tmp_path: Path) -> AsyncIterator[tuple[Deployment, Frontend, ToyTarget]]:
    target = ToyTarget()
    drafters = [ToyDrafter("good", target, 0.8), ToyDrafter("weak", target, 6.0, seed=3)]
    engine = Engine(target, drafters, embedded(str(tmp_path)), target_digest=model_digest("t"),
                    tokenizer_digest=model_digest("w"))
    async with engine.deployment() as d:
        frontend = mount_frontend(d.router, ToyWords(), stop=(EOS,), model="toy", max_tokens=12)
        yield d, frontend, target


def post(path: str, body: Any, headers: dict[str, str] | None = None) -> Request:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return Request("POST", path, body=raw, headers=headers or {"content-type": "application/json"})


async def events(response: Response) -> list[Any]:
    """The stream's messages, the last of them :data:`~sdcp_fast.roles.sse.DONE`."""
    assert response.stream is not None
    out = [message async for message in messages(response.stream)]
    assert out[-1] == DONE and DONE not in out[:-1]
    return out


def test_completion_is_greedy_decoding_and_streams_the_same_text(tmp_path: Path) -> None:
    async def scenario() -> tuple[Any, list[Any], list[int]]:
        async with deployment(tmp_path) as (d, _, target):
            plain = await d.router.handler(post("v1/completions", {"model": "toy", "prompt": PROMPT}))
            assert plain.status == 200 and plain.content_type == "application/json"
            streamed = await d.router.handler(post("v1/completions", {
                "model": "toy", "prompt": PROMPT, "stream": True, "stream_options": {"include_usage": True}}))
            assert streamed.status == 200 and streamed.content_type == "text/event-stream"
            return json.loads(plain.body), await events(streamed), greedy(target, encode(PROMPT), 12)

    body, frames, expected = loop.run(scenario())
    text = body["choices"][0]["text"]
    assert text == decode(expected)  # rule 1: the target's greedy continuation
    assert body["object"] == "text_completion" and body["id"].startswith("cmpl-")
    assert body["choices"][0]["finish_reason"] == ("stop" if expected[-1] == EOS else "length")
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": len(expected),
                             "total_tokens": 3 + len(expected)}
    assert frames[-1] == "[DONE]"
    chunks = [f for f in frames[:-1] if f["choices"]]
    assert "".join(c["choices"][0]["text"] for c in chunks) == text
    assert [c["choices"][0]["finish_reason"] for c in chunks][-1] == body["choices"][0]["finish_reason"]
    assert frames[-2]["usage"] == body["usage"]


def test_chat_completion_streams_deltas(tmp_path: Path) -> None:
    async def scenario() -> tuple[Any, list[Any]]:
        async with deployment(tmp_path) as (d, _, _):
            request = {"model": "toy", "messages": [{"role": "system", "content": "the"},
                                                    {"role": "user", "content": "verifier commits"}]}
            plain = await d.router.handler(post("v1/chat/completions", request))
            streamed = await d.router.handler(post("v1/chat/completions", {**request, "stream": True}))
            return json.loads(plain.body), await events(streamed)

    body, frames = loop.run(scenario())
    message = body["choices"][0]["message"]
    assert body["object"] == "chat.completion" and message["role"] == "assistant" and message["content"]
    chunks = frames[:-1]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == message["content"]
    assert chunks[-1]["choices"][0]["finish_reason"] == body["choices"][0]["finish_reason"]


def test_sampled_completion_runs_rule_2(tmp_path: Path) -> None:
    async def scenario() -> tuple[Any, Any]:
        async with deployment(tmp_path) as (d, _, _):
            request = {"model": "toy", "prompt": PROMPT, "temperature": 0.8, "seed": 3, "max_tokens": 10}
            first = json.loads((await d.router.handler(post("v1/completions", request))).body)
            rules = {r.contract.rule for r in d.router.sessions.values()}
            return first, rules

    body, rules = loop.run(scenario())
    assert rules == {RULE_SPECULATIVE}
    assert body["usage"]["completion_tokens"] >= 1


def test_models_and_errors_are_openai_shaped(tmp_path: Path) -> None:
    async def scenario() -> list[tuple[int, Any]]:
        async with deployment(tmp_path) as (d, _, _):
            requests = [
                Request("GET", "v1/models"),
                post("v1/completions", {"model": "gpt-4", "prompt": PROMPT}),
                post("v1/completions", b"{not json"),
                post("v1/completions", {"prompt": PROMPT, "temperature": 9}),
                post("v1/completions", {"prompt": PROMPT, "stop": ["a", "b", "c", "d", "e"]}),
                post("v1/completions", {"prompt": "zebra"}),
                post("v1/completions", {"prompt": PROMPT}, headers={"content-type": "text/plain"}),
                Request("GET", "v1/completions"),
                Request("GET", "v1/embeddings"),
            ]
            out = []
            for request in requests:
                response = await d.router.handler(request)
                assert response.content_type == "application/json"
                out.append((response.status, json.loads(response.body)))
            return out

    models, *errors = loop.run(scenario())
    assert models == (200, {"object": "list", "data": [{"id": "toy", "object": "model", "created": 0,
                                                         "owned_by": "sdcp-fast"}]})
    assert [status for status, _ in errors] == [404, 400, 400, 400, 400, 415, 405, 404]
    for _, body in errors:
        assert set(body["error"]) == {"message", "type", "param", "code"} and body["error"]["message"]
    assert errors[0][1]["error"]["code"] == "model_not_found"
    assert errors[2][1]["error"]["param"] == "temperature"


def test_no_live_verifier_is_a_server_error(tmp_path: Path) -> None:
    async def scenario() -> tuple[int, Any]:
        async with deployment(tmp_path) as (d, _, _):
            d.router.table = type(d.router.table)()  # nobody has reported status
            d.router.table.report = lambda *_: None  # type: ignore[method-assign]  # nor reports now
            response = await d.router.handler(post("v1/completions", {"prompt": PROMPT}))
            return response.status, json.loads(response.body)

    status, body = loop.run(scenario())
    assert status >= 400 and body["error"]["message"]


def test_leaving_a_stream_stops_reading_the_session(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with deployment(tmp_path) as (d, _, _):
            response = await d.router.handler(post("v1/completions", {"prompt": PROMPT, "stream": True,
                                                                       "max_tokens": 40}))
            assert response.stream is not None
            chunks = response.stream.__aiter__()
            await chunks.__anext__()
            await chunks.aclose()  # type: ignore[attr-defined]
            # The generator ran its cleanup: nothing more is read for this client.
            with pytest.raises(StopAsyncIteration):
                await chunks.__anext__()

    loop.run(scenario())


def test_output_of_a_lower_epoch_is_discarded(tmp_path: Path) -> None:
    """§6.7: "a front end that receives output with a lower epoch than one it has seen discards
    it". The verifier's output is relabelled epoch 2 (as after a fail-over), and after its first
    piece an old verifier's epoch-1 output at the next index arrives: other tokens, and final.
    The client's text is still the target's greedy continuation, to its length."""
    async def scenario() -> tuple[Any, list[int], int]:
        async with deployment(tmp_path) as (d, _, target):
            real, stale = d.router.client.output, []

            async def output(verifier: str, session: bytes, start: int, **kw: Any) -> Output:
                if start > 0 and not stale:
                    stale.append(start)
                    return Output(session, 1, start, tuple(encode("zebra zebra")), True, Action.FAIL)
                return replace(await real(verifier, session, start, **kw), epoch=2)

            d.router.client.output = output  # type: ignore[method-assign]
            response = await d.router.handler(post("v1/completions", {"prompt": PROMPT, "max_tokens": 12}))
            return json.loads(response.body), greedy(target, encode(PROMPT), 12), len(stale)

    body, expected, stale = loop.run(scenario())
    assert stale == 1
    assert body["choices"][0]["text"] == decode(expected)
    assert body["usage"]["completion_tokens"] == len(expected)


# -- the official client over HTTP/2 + mutual TLS ---------------------------------------------

def test_openai_client_streams_a_completion_over_h2_mtls(tmp_path: Path) -> None:
    openai = pytest.importorskip("openai", reason="the openai client is in the dev extra")
    # openai 3 runs on httpx2 (httpx's successor, same API); earlier versions on httpx.
    httpx = pytest.importorskip("httpx2" if _has("httpx2") else "httpx", reason="openai's HTTP library is missing")
    from sdcp_fast.transport.certs import InstanceSpec, write_certificates
    from sdcp_fast.transport.h2server import serve
    from sdcp_fast.transport.tls import client_context, server_context

    write_certificates(tmp_path / "certs", [InstanceSpec("router", PeerRole.ROUTER, "https://127.0.0.1/"),
                                            InstanceSpec("app", PeerRole.CLIENT)])
    certs = tmp_path / "certs"

    async def scenario() -> tuple[str, str, str, list[int], str | None]:
        async with deployment(tmp_path) as (d, _, target):
            ctx = server_context(str(certs / "router.pem"), str(certs / "router.key"), str(certs / "ca.pem"))
            async with await serve(d.router.handler, "127.0.0.1", 0, ssl=ctx) as server:
                tls = client_context(str(certs / "app.pem"), str(certs / "app.key"), str(certs / "ca.pem"))
                http = httpx.AsyncClient(http2=True, verify=tls)
                client = openai.AsyncOpenAI(api_key="unused", base_url=f"https://127.0.0.1:{server.port}/v1",
                                            http_client=http, max_retries=0)
                try:
                    stream = await client.completions.create(model="toy", prompt=PROMPT, max_tokens=12,
                                                             stream=True)
                    pieces = [c.choices[0].text async for c in stream if c.choices]
                    whole = await client.completions.create(model="toy", prompt=PROMPT, max_tokens=12)
                    chat = await client.chat.completions.create(
                        model="toy", messages=[{"role": "user", "content": PROMPT}], max_tokens=12, stream=True)
                    said = [c.choices[0].delta.content or "" async for c in chat if c.choices]
                    probe = await http.get(f"https://127.0.0.1:{server.port}/v1/models")
                    version = probe.http_version
                finally:
                    await client.close()
                    await http.aclose()
            return "".join(pieces), whole.choices[0].text, "".join(said), greedy(target, encode(PROMPT), 12), \
                version

    streamed, whole, chat_text, expected, version = loop.run(scenario())
    assert version == "HTTP/2"
    assert streamed == whole == decode(expected)
    assert chat_text == streamed  # the toy model's chat template is the words themselves


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def test_a_cancelled_reader_leaves_the_router_serving(tmp_path: Path) -> None:
    async def scenario() -> int:
        async with deployment(tmp_path) as (d, _, _):
            response = await d.router.handler(post("v1/completions", {"prompt": PROMPT, "stream": True}))
            assert response.stream is not None
            task = asyncio.ensure_future(response.stream.__anext__())
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                await task
            again = await d.router.handler(post("v1/completions", {"prompt": PROMPT}))
            return again.status

    assert loop.run(scenario()) == 200


# -- fail-over mid-stream ---------------------------------------------------------------------

def test_streamed_text_is_unaffected_by_a_verifier_failover(tmp_path: Path) -> None:
    """The active verifier falls silent after round 3 of a streamed rule-1 completion; the
    router fails the session over to the standby (epoch 2). The client's text is the target's
    greedy continuation: no piece repeated, none missing."""
    from .rolekit import DRAFTER, Failover, until

    active_uri, standby_uri = "inproc://verifier-a/", "inproc://verifier-b/"
    parts = Failover(str(tmp_path))
    clock, mlc, target = parts.clock, parts.mlc, parts.target
    killed, kill_after_round_3 = parts.partition_after(active_uri, 3)

    async def scenario() -> tuple[list[Any], int, list[int]]:
        router = parts.router()
        mount_frontend(router, ToyWords(), stop=(), model="toy", defaults=SessionSpec((), m_max=3, m_init=3))
        active, standby = parts.verifier(active_uri, kill_after_round_3), parts.verifier(standby_uri)
        drafter = parts.drafter()
        roles = [active, drafter, standby]
        for role in roles[:2]:
            await role.start()
        try:
            await until(lambda: router.table.status(DRAFTER, clock()) is not None)
            response = await router.handler(post("v1/completions", {"prompt": PROMPT, "max_tokens": 30,
                                                                   "stream": True}))
            await standby.start()
            reading = asyncio.create_task(events(response))
            await until(lambda: killed)
            clock.advance(11.0)  # past the silent verifier's ttl_ms; the others report again
            await standby.report_status()
            await drafter.report_status()
            await router.sweep()
            frames = await asyncio.wait_for(reading, 15.0)
            (routed,) = router.sessions.values()
            return frames, routed.epoch, greedy(target, encode(PROMPT), 30)
        finally:
            for role in roles:
                await role.close()

    try:
        frames, epoch, expected = loop.run(scenario())
    finally:
        mlc.close()
    assert epoch == 2 and killed
    text = "".join(f["choices"][0]["text"] for f in frames[:-1])
    assert text == decode(expected) and frames[-2]["choices"][0]["finish_reason"] == "length"
