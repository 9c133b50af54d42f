"""The front end's client-facing listeners (roles/frontend_server.py) on loopback ports, in
front of the in-process roles (toy model): the official ``openai`` client with nothing but
``base_url`` and ``api_key``, HTTP/2 with prior knowledge, API keys, the per-key limit,
hostile bodies, the context check, stop strings, and a client that goes away cancelling its
session at the verifier."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from sdcp_fast.deploy.local import Deployment, Engine, model_digest
from sdcp_fast.model.toy import EOS, ToyDrafter, ToyTarget, decode, encode
from sdcp_fast.protocol.session import State
from sdcp_fast.roles.frontend import Frontend, mount_frontend
from sdcp_fast.roles.frontend_admission import QUEUE
from sdcp_fast.roles.frontend_server import FrontendServer, api_keys
from sdcp_fast.roles.frontend_text import ToyWords
from sdcp_fast.store import embedded
from sdcp_fast.transport import loop

from .test_frontend import PROMPT, greedy

KEY = "sk-test-0123456789"
CONTEXT = 64
JSON_KEY = {"content-type": "application/json", "authorization": f"Bearer {KEY}"}


@contextlib.asynccontextmanager
async def served(tmp_path: Path, *, per_key: int = 16, keys: tuple[str, ...] = (KEY,), slow: float = 0.0,
                 context: int = 8192, queue: int = QUEUE) -> AsyncIterator[tuple[Deployment, str, ToyTarget]]:
    """The in-process roles, their front end on 127.0.0.1:<free port>; the API's base URL."""
    target = ToyTarget()
    if slow:
        score = target.score

        def slowly(batch: Any) -> Any:
            import time

            time.sleep(slow)  # a scoring pass that takes time, as a real model's does
            return score(batch)

        target.score = slowly  # type: ignore[method-assign]
    drafters = [ToyDrafter("good", target, 0.8)]
    engine = Engine(target, drafters, embedded(str(tmp_path)), target_digest=model_digest("t"),
                    tokenizer_digest=model_digest("w"))
    async with engine.deployment() as d:
        frontend = mount_frontend(d.router, ToyWords(), stop=(EOS,), model="toy", max_tokens=12, context=context)
        server = FrontendServer(frontend, keys, per_key=per_key, queue=queue)
        url = await server.start("127.0.0.1", 0)
        try:
            yield d, url, target
        finally:
            await server.close()


async def post(url: str, path: str, body: bytes | dict[str, Any], key: str | None = KEY) -> tuple[int, Any, Any]:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"content-type": "application/json", **({"authorization": f"Bearer {key}"} if key else {})}
    async with aiohttp.ClientSession() as http, http.post(f"{url}/{path}", data=raw, headers=headers) as r:
        text = await r.text()
        return r.status, r.headers, json.loads(text) if r.content_type == "application/json" else text


def test_the_plain_openai_client_streams_a_completion_and_a_chat(tmp_path: Path) -> None:
    openai = pytest.importorskip("openai", reason="the openai client is in the dev extra")

    async def scenario() -> tuple[str, str, str, Any, list[int]]:
        async with served(tmp_path) as (_, url, target):
            client = openai.AsyncOpenAI(base_url=url, api_key=KEY)
            try:
                stream = await client.completions.create(model="toy", prompt=PROMPT, max_tokens=12, stream=True,
                                                         stream_options={"include_usage": True})
                chunks = [c async for c in stream]
                text = "".join(c.choices[0].text for c in chunks if c.choices)
                chat = await client.chat.completions.create(
                    model="toy", messages=[{"role": "user", "content": PROMPT}], max_completion_tokens=12, stream=True)
                said = "".join([c.choices[0].delta.content or "" async for c in chat if c.choices])
                models = await client.models.list()
                whole = await client.completions.create(model="toy", prompt=PROMPT, max_tokens=12, seed=7)
            finally:
                await client.close()
            assert [m.id for m in models.data] == ["toy"]
            return text, said, whole.choices[0].text, chunks[-1].usage, greedy(target, encode(PROMPT), 12)

    text, said, whole, usage, expected = loop.run(scenario())
    assert text == said == whole == decode(expected)
    assert usage.completion_tokens == len(expected) and usage.prompt_tokens == len(encode(PROMPT))


def test_a_wrong_or_missing_key_is_401_and_the_openai_client_says_so(tmp_path: Path) -> None:
    openai = pytest.importorskip("openai", reason="the openai client is in the dev extra")

    async def scenario() -> tuple[int, int, Any]:
        async with served(tmp_path) as (_, url, _):
            wrong, _, body = await post(url, "completions", {"prompt": PROMPT}, key="sk-wrong")
            missing, _, _ = await post(url, "completions", {"prompt": PROMPT}, key=None)
            client = openai.AsyncOpenAI(base_url=url, api_key="sk-wrong", max_retries=0)
            try:
                with pytest.raises(openai.AuthenticationError):
                    await client.completions.create(model="toy", prompt=PROMPT)
            finally:
                await client.close()
            return wrong, missing, body

    wrong, missing, body = loop.run(scenario())
    assert wrong == missing == 401
    assert body["error"]["code"] == "invalid_api_key" and set(body["error"]) == {"message", "type", "param", "code"}


def test_hostile_bodies_are_4xx_in_openai_shape(tmp_path: Path) -> None:
    bodies: list[bytes | dict[str, Any]] = [
        b"[" * 3000 + b"]" * 3000,
        b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        b"{" * 50_000,
        b'{"prompt": "the", "max_tokens": "many"}',
        b'{"prompt": [1e999]}',
        b'{"prompt": [99999999999999999999999]}',
        b'{"prompt": "\\ud800"}',
        {"prompt": PROMPT, "n": 2},
        {"prompt": PROMPT, "seed": 2**80},
        {"prompt": PROMPT, "stream_options": [1]},
        {"messages": [{"role": "user", "content": {"deep": [[[]]]}}]},
        b"x" * (5 << 20),
        b"\xff\xfe",
        b"null",
    ]

    async def scenario() -> list[tuple[int, Any]]:
        async with served(tmp_path) as (_, url, _):
            out = []
            for i, body in enumerate(bodies):
                path = "chat/completions" if i == 10 else "completions"
                status, _, answer = await post(url, path, body)
                out.append((status, answer))
            return out

    for status, answer in loop.run(scenario()):
        assert 400 <= status < 500, (status, answer)
        assert set(answer["error"]) == {"message", "type", "param", "code"}, answer


def test_a_prompt_beyond_the_context_is_400_context_length_exceeded(tmp_path: Path) -> None:
    openai = pytest.importorskip("openai", reason="the openai client is in the dev extra")

    async def scenario() -> tuple[int, Any, Any]:
        async with served(tmp_path, context=CONTEXT) as (_, url, _):
            status, _, body = await post(url, "completions", {"prompt": "the " * (CONTEXT - 4), "max_tokens": 8})
            client = openai.AsyncOpenAI(base_url=url, api_key=KEY, max_retries=0)
            try:
                with pytest.raises(openai.BadRequestError) as raised:
                    await client.chat.completions.create(
                        model="toy", messages=[{"role": "user", "content": "the " * 10_000}])
            finally:
                await client.close()
            return status, body, raised.value

    status, body, error = loop.run(scenario())
    assert status == 400 and body["error"]["code"] == "context_length_exceeded"
    assert f"maximum context length is {CONTEXT}" in body["error"]["message"]
    assert error.code == "context_length_exceeded"


def test_a_stop_string_ends_the_text_before_it_and_the_session(tmp_path: Path) -> None:
    async def scenario() -> tuple[str, str, Any, Deployment]:
        async with served(tmp_path) as (d, url, target):
            full = decode(greedy(target, encode(PROMPT), 12))
            words = full.split()
            stop = " ".join(words[3:5])  # two tokens
            status, _, body = await post(url, "completions", {"prompt": PROMPT, "max_tokens": 12, "stop": stop})
            assert status == 200
            return full, stop, body, d

    full, stop, body, _ = loop.run(scenario())
    text = body["choices"][0]["text"]
    assert text == full[: full.index(stop)] and body["choices"][0]["finish_reason"] == "stop"


def test_a_client_that_goes_away_ends_its_session_at_the_verifier(tmp_path: Path) -> None:
    """The stream is dropped after its first event: the router cancels the session
    (DELETE sessions/{id}), the verifier drops it from its registry and releases its cache, and
    it stops well short of max_tokens."""
    released: list[bytes] = []

    async def scenario() -> tuple[int, int]:
        async with served(tmp_path, slow=0.01) as (d, url, target):
            real = target.release

            def release(session: bytes) -> None:
                released.append(session)
                real(session)

            target.release = release  # type: ignore[method-assign]
            body = json.dumps({"prompt": PROMPT, "max_tokens": 4000, "stream": True}).encode()
            async with aiohttp.ClientSession() as http:
                r = await http.post(f"{url}/completions", data=body, headers=JSON_KEY)
                await r.content.readuntil(b"\n\n")
                await r.content.readuntil(b"\n\n")
                r.close()  # the client goes away
            (session,) = d.router.sessions
            live = d.verifier.live(session)
            for _ in range(500):
                if released:  # after the round in a pass, if any, was committed
                    break
                await asyncio.sleep(0.01)
            committed = live.session.committed
            await asyncio.sleep(0.3)
            assert live.session.committed == committed  # nothing decoded after the cancel
            assert d.router.sessions[session].done
            return committed, len(d.verifier.sessions)

    committed, left = loop.run(scenario())
    assert left == 0 and released and committed < 4000


def test_a_client_that_gives_up_on_a_non_streamed_request_ends_its_session(tmp_path: Path) -> None:
    async def scenario() -> tuple[int, bool]:
        async with served(tmp_path, slow=0.01) as (d, url, _):
            body = json.dumps({"prompt": PROMPT, "max_tokens": 4000}).encode()
            async with aiohttp.ClientSession() as http:
                asking = asyncio.ensure_future(http.post(f"{url}/completions", data=body, headers=JSON_KEY))
                for _ in range(500):
                    if d.router.sessions:
                        break
                    await asyncio.sleep(0.01)
                asking.cancel()  # the client gives up (while the session opens, or after)
                with contextlib.suppress(asyncio.CancelledError):
                    await asking
            (session,) = d.router.sessions
            for _ in range(500):
                if session not in d.verifier.sessions:
                    break
                await asyncio.sleep(0.01)
            return len(d.verifier.sessions), d.router.sessions[session].done

    assert loop.run(scenario()) == (0, True)


def test_a_stream_closed_before_its_first_event_ends_its_session(tmp_path: Path) -> None:
    """The client went away between the answer's headers and its body: the stream is closed
    unstarted, and the session is cancelled all the same; the in-flight count is given back."""
    from sdcp_fast.transport.base import Request

    async def scenario() -> tuple[bool, bool, dict[str, int]]:
        async with served(tmp_path, slow=0.01) as (d, _, _):
            server = FrontendServer(_frontend_of(d), (KEY,))
            body = json.dumps({"prompt": PROMPT, "max_tokens": 4000, "stream": True}).encode()
            answer = await server.handle(Request("POST", "v1/completions", body=body, headers=JSON_KEY))
            assert answer.stream is not None
            await answer.stream.aclose()  # type: ignore[attr-defined]
            (session,) = d.router.sessions
            for _ in range(500):
                if session not in d.verifier.sessions:
                    break
                await asyncio.sleep(0.01)
            return d.router.sessions[session].done, session in d.verifier.sessions, server._in_flight

    assert loop.run(scenario()) == (True, False, {})


def test_one_request_over_the_per_key_limit_is_429_with_retry_after(tmp_path: Path) -> None:
    async def scenario() -> tuple[int, Any, Any]:
        async with served(tmp_path, per_key=1, slow=0.01, queue=0) as (_, url, _):  # no queue: refused at once
            body = json.dumps({"prompt": PROMPT, "max_tokens": 4000, "stream": True}).encode()
            async with aiohttp.ClientSession() as http:
                first = await http.post(f"{url}/completions", data=body, headers=JSON_KEY)
                await first.content.readuntil(b"\n\n")
                status, headers, answer = await post(url, "completions", {"prompt": PROMPT})
                first.close()
            return status, headers, answer

    status, headers, answer = loop.run(scenario())
    assert status == 429 and headers["retry-after"] == "1" and answer["error"]["type"] == "rate_limit_error"


def test_http2_with_prior_knowledge_serves_the_same_api_and_a_reset_stream_ends_its_session(tmp_path: Path) -> None:
    """The HTTP/2 listener (h2c on loopback): the official client streams through it with an
    HTTP/2-only httpx client; a wrong key is 401; a stream the client leaves is cancelled."""
    openai = pytest.importorskip("openai", reason="the openai client is in the dev extra")
    httpx = pytest.importorskip("httpx2", reason="openai 3's HTTP library")

    async def scenario() -> tuple[str, str, str, int, int, list[int]]:
        async with served(tmp_path, slow=0.005) as (d, url, target):
            server = FrontendServer(_frontend_of(d), (KEY,))
            h2_url = await server.start_h2("127.0.0.1", 0)
            http = httpx.AsyncClient(http1=False, http2=True)
            try:
                client = openai.AsyncOpenAI(base_url=h2_url, api_key=KEY, http_client=http)
                stream = await client.completions.create(model="toy", prompt=PROMPT, max_tokens=12, stream=True)
                text = "".join([c.choices[0].text async for c in stream if c.choices])
                probe = await http.get(f"{h2_url}/models", headers={"authorization": f"Bearer {KEY}"})
                wrong = await http.get(f"{h2_url}/models", headers={"authorization": "Bearer sk-wrong"})
                before = set(d.router.sessions)
                leaving = httpx.AsyncClient(http1=False, http2=True)
                r = await leaving.send(leaving.build_request(
                    "POST", f"{h2_url}/completions", headers=JSON_KEY,
                    json={"prompt": PROMPT, "max_tokens": 4000, "stream": True}), stream=True)
                async for _ in r.aiter_bytes():
                    break
                await leaving.aclose()  # the client goes away: its connection ends
                (session,) = set(d.router.sessions) - before
                for _ in range(500):
                    if d.router.sessions[session].done and session not in d.verifier.sessions:
                        break
                    await asyncio.sleep(0.01)
                left = int(session in d.verifier.sessions)
            finally:
                await http.aclose()
                await server.close()
            return text, probe.http_version, str(probe.status_code), wrong.status_code, left, \
                greedy(target, encode(PROMPT), 12)

    text, version, ok, wrong, left, expected = loop.run(scenario())
    assert version == "HTTP/2" and ok == "200" and wrong == 401
    assert text == decode(expected) and left == 0


def _frontend_of(d: Deployment) -> Frontend:
    return Frontend(d.router, ToyWords(), stop=(EOS,), model="toy", max_tokens=12)


def test_no_keys_configured_asks_none_and_keys_come_from_a_file_and_the_environment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async def scenario() -> int:
        async with served(tmp_path, keys=()) as (_, url, _):
            status, _, _ = await post(url, "completions", {"prompt": PROMPT, "max_tokens": 2}, key=None)
            return status

    assert loop.run(scenario()) == 200
    (tmp_path / "keys").write_text("# ours\nsk-a\n\nsk-b\n")
    monkeypatch.setenv("SDCP_FAST_API_KEY", "sk-c")
    assert api_keys(["sk-z"], str(tmp_path / "keys")) == ("sk-z", "sk-a", "sk-b", "sk-c")


def test_other_roles_certificates_may_not_use_the_front_end_on_the_sdcp_port(tmp_path: Path) -> None:
    from sdcp_fast.protocol.peer import Peer, PeerRole
    from sdcp_fast.transport.base import Request

    async def scenario() -> list[int]:
        async with served(tmp_path) as (d, _, _):
            out = []
            for role in (PeerRole.DRAFTER, PeerRole.VERIFIER, PeerRole.CLIENT):
                request = Request("GET", "v1/models", peer=Peer("https://x.test/", role))
                out.append((await d.router.handler(request)).status)
            return out

    assert loop.run(scenario()) == [403, 403, 200]


def test_only_the_router_may_cancel_a_session_at_the_verifier(tmp_path: Path) -> None:
    from sdcp_fast.deploy.local import ROUTER
    from sdcp_fast.protocol.messages import session_path_id
    from sdcp_fast.protocol.peer import Peer, PeerRole
    from sdcp_fast.roles.router import serving_spec
    from sdcp_fast.transport.base import Request

    async def scenario() -> tuple[list[int], State]:
        async with served(tmp_path, slow=0.01) as (d, _, _):
            routed = await d.router.open(serving_spec(encode(PROMPT), max_new=4000))
            path = f"sessions/{session_path_id(routed.session)}"
            out = []
            for peer in (Peer("https://drafter.test/", PeerRole.DRAFTER), Peer("https://other.test/", PeerRole.ROUTER),
                         Peer(ROUTER, PeerRole.ROUTER), Peer(ROUTER, PeerRole.ROUTER)):
                out.append((await d.verifier.handler(Request("DELETE", path, peer=peer))).status)
            return out, d.verifier.sessions.records() and State.READY or State.FINISHED

    statuses, _ = loop.run(scenario())
    assert statuses == [403, 403, 204, 404]
