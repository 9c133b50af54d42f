"""Resuming a stream (roles/frontend.py, docs/frontend.md "Resuming a stream"): the same request
sent again with ``Last-Event-ID`` gets the rest of the text, nothing lost or repeated, at the
router that served it or at a second router sharing its routing records, which adopts the
session; ids that name nothing to resume are OpenAI-style 4xx."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from sdcp_fast.deploy.local import Deployment
from sdcp_fast.model.toy import EOS, ToyTarget, decode, encode
from sdcp_fast.protocol.peer import Peer, PeerRole
from sdcp_fast.roles.frontend import Frontend, mount_frontend
from sdcp_fast.roles.frontend_text import ToyWords
from sdcp_fast.roles.router import RouterRole
from sdcp_fast.roles.sse import DONE, event_id, events
from sdcp_fast.transport import loop
from sdcp_fast.transport.base import Response
from tests.roles.test_frontend import PROMPT, deployment, greedy, post

OTHER = "inproc://router-b/"


@contextlib.asynccontextmanager
async def two_routers(tmp_path: Path) -> AsyncIterator[tuple[Deployment, Frontend, RouterRole, ToyTarget]]:
    """The in-process deployment and a second router over the same MLC, scope and instances."""
    async with deployment(tmp_path) as (d, _, target):
        a = d.router
        b = RouterRole(uri=OTHER, mlc=a.mlc, transport=d.network.transport(Peer(OTHER, PeerRole.ROUTER)),
                       target_digest=a.target_digest, tokenizer_digest=a.tokenizer_digest, drafter_models={},
                       scope=a.scope, clock=a.clock)
        b.table = a.table  # the instances report to both (--router a,b); here they share one table
        routers = f"{a.uri},{OTHER}"  # its events and status go to both
        d.verifier.config, d.verifier.committer.router = replace(d.verifier.config, router=routers), routers
        d.network.register(OTHER, b.handler)
        frontend = mount_frontend(b, ToyWords(), stop=(EOS,), model="toy", max_tokens=12)
        await b.start()
        try:
            yield d, frontend, b, target
        finally:
            await b.close()


def request(last: str | None = None, **body: Any):
    headers = {"content-type": "application/json"}
    if last is not None:
        headers["last-event-id"] = last
    return post("v1/completions", {"prompt": PROMPT, "stream": True, "max_tokens": 40, **body}, headers)


CUT: list[Any] = []  # streams left as a dead router leaves them: neither read on nor closed


async def read(response: Response, stop_after: int | None = None) -> list[tuple[str | None, Any]]:
    """The stream's (id, message) pairs; with ``stop_after``, only until that many carried text
    (as when the router dies: the stream is left unread, not closed, which would cancel the
    session as a client that goes away does)."""
    assert response.status == 200 and response.stream is not None
    out: list[tuple[str | None, Any]] = []
    pairs = events(response.stream)
    if stop_after is not None:
        CUT.append((response, pairs))
    async for ident, message in pairs:
        out.append((ident, message))
        if stop_after is not None and sum(1 for _, m in out if m != DONE and m["choices"][0]["text"]) >= stop_after:
            break
    return out


def text(pairs: list[tuple[str | None, Any]]) -> str:
    return "".join(m["choices"][0]["text"] for _, m in pairs if m != DONE and m.get("choices"))


def test_a_stream_resumed_at_a_second_router_is_the_uninterrupted_text(tmp_path: Path) -> None:
    async def scenario() -> tuple[str, str, list[tuple[str | None, Any]], list[int], RouterRole, bytes]:
        async with two_routers(tmp_path) as (d, _, b, target):
            first = await d.router.handler(request())
            before = await read(first, stop_after=2)
            last = before[-1][0]
            assert last is not None
            session = bytes.fromhex(last.split(":")[0])
            after = await read(await b.handler(request(last)))
            return text(before), text(after), after, greedy(target, encode(PROMPT), 40), b, session

    head, tail, after, expected, b, session = loop.run(scenario())
    assert (head + tail).split() == decode([t for t in expected if t != EOS]).split()
    assert head and tail
    assert after[-1][1] == DONE and after[-2][0] == event_id(session, None)
    indices = [int(i.split(":")[1]) for i, m in after if m != DONE and i and not i.endswith(":end")]
    assert indices == sorted(indices)
    assert session in b.sessions  # adopted


def test_a_stream_resumes_at_the_same_router_after_any_event_even_once_it_ended(tmp_path: Path) -> None:
    """Cut after the first, second, ... event; and resumed from every event of a whole stream
    (the session ended: its verifier still serves its output)."""
    async def scenario() -> tuple[str, list[str], list[int]]:
        async with two_routers(tmp_path) as (d, _, _, target):
            whole = await read(await d.router.handler(request()))
            full = text(whole)
            rests = []
            for cut in (1, 2, 3):
                before = await read(await d.router.handler(request()), stop_after=cut)
                last = before[-1][0]
                assert last is not None
                rests.append(text(before) + text(await read(await d.router.handler(request(last)))))
            for i, (ident, message) in enumerate(whole):
                if ident is None or ident.endswith(":end") or message == DONE:
                    continue
                rest = await read(await d.router.handler(request(ident)))
                rests.append(text(whole[:i + 1]) + text(rest))
            return full, rests, greedy(target, encode(PROMPT), 40)

    full, rests, expected = loop.run(scenario())
    assert full.split() == decode([t for t in expected if t != EOS]).split()
    assert len(rests) > 3 and all(r == full for r in rests)


def test_ids_that_name_nothing_to_resume_are_openai_errors(tmp_path: Path) -> None:
    async def scenario() -> dict[str, tuple[int, Any]]:
        async with two_routers(tmp_path) as (d, _, b, _):
            whole = await read(await d.router.handler(request()))
            some = next(i for i, m in whole if i is not None and not i.endswith(":end"))
            session = some.split(":")[0]
            out = {}
            cases = {
                "malformed": (d.router, request("not-an-id")),
                "unknown": (b, request("ab" * 16 + ":3")),
                "other request": (b, request(some, prompt="the verifier")),
                "not a stream": (b, request(some, stream=False)),
            }
            cut = await d.router.handler(request())
            assert cut.stream is not None
            await cut.stream.__anext__()
            await cut.stream.aclose()  # type: ignore[attr-defined]  # the reader went away: cancelled
            cancelled = await d.router.handler(request())  # a second one, for its id
            cut_id = (await read(cancelled, stop_after=1))[-1][0]
            assert cut_id is not None
            await d.router.cancel(bytes.fromhex(cut_id.split(":")[0]))
            cases["cancelled"] = (b, request(cut_id))
            for name, (router, req) in cases.items():
                response = await router.handler(req)
                out[name] = response.status, json.loads(response.body)
            closing = await d.router.handler(request(session + ":end"))
            out["after the end"] = closing.status, [m async for _, m in events(closing.stream)]
            return out

    out = loop.run(scenario())
    assert out["malformed"][0] == 400 and out["malformed"][1]["error"]["code"] == "invalid_last_event_id"
    assert out["unknown"][0] == 404 and out["unknown"][1]["error"]["code"] == "session_not_found"
    assert out["other request"][0] == 409 and out["other request"][1]["error"]["code"] == "last_event_id_mismatch"
    assert out["not a stream"][0] == 400
    assert out["cancelled"][0] == 410 and out["cancelled"][1]["error"]["code"] == "session_finished"
    assert out["after the end"] == (200, [DONE])


def test_ids_of_a_stream_holding_text_back_for_a_stop_string_name_the_tokens_sent(tmp_path: Path) -> None:
    """A stop string holds back text that could be its start, so an event is sent tokens after
    the output its text ends at: its id names the tokens its text covers, and a resume after
    it sends the held-back text, not what follows the tokens committed by then."""
    stop = "no output holds this long stop string"  # never matched: every token's text is held for a while

    async def scenario() -> tuple[list[tuple[str | None, Any]], list[str], list[int]]:
        async with two_routers(tmp_path) as (d, _, b, target):
            whole = await read(await d.router.handler(request(stop=stop)))
            rests = []
            for i, (ident, message) in enumerate(whole):
                if ident is None or ident.endswith(":end") or message == DONE:
                    continue
                rest = await read(await b.handler(request(ident, stop=stop)))
                rests.append(text(whole[:i + 1]) + text(rest))
            return whole, rests, greedy(target, encode(PROMPT), 40)

    whole, rests, expected = loop.run(scenario())
    full = decode([t for t in expected if t != EOS])
    assert text(whole).split() == full.split()
    ids = [(i, ident) for i, (ident, m) in enumerate(whole) if ident and not ident.endswith(":end") and m != DONE]
    for i, ident in ids:
        index = int(ident.split(":")[1])
        assert text(whole[:i + 1]).split() == decode(expected[:index]).split(), ident
    pieces = [m["choices"][0]["text"] for _, m in whole if m != DONE and m["choices"][0]["text"]]
    assert len(ids) > 2 and len(pieces[-1]) >= len(stop) - 1  # the held-back text came with the last piece
    assert rests and all(r.split() == full.split() for r in rests)


def test_a_resume_with_other_stop_strings_names_another_request(tmp_path: Path) -> None:
    """The stop strings decide which text a stream holds back and where it ends, so the same
    prompt with other ``stop`` strings does not resume the stream; the same ones do."""
    async def scenario() -> list[tuple[int, bytes]]:
        async with two_routers(tmp_path) as (d, _, b, _):
            whole = await read(await d.router.handler(request(stop=["zzz"])))
            some = next(i for i, m in whole if i is not None and not i.endswith(":end"))
            out = []
            for router in (d.router, b):
                for stop in (["qqq"], None, ["zzz"]):
                    extra = {} if stop is None else {"stop": stop}
                    response = await router.handler(request(some, **extra))
                    out.append((response.status, response.body))
            return out

    results = loop.run(scenario())
    for status, body in results[0:2] + results[3:5]:
        assert status == 409
        assert json.loads(body)["error"]["code"] == "last_event_id_mismatch"
    assert results[2][0] == 200 and results[5][0] == 200


def test_a_resume_with_another_max_tokens_names_another_request(tmp_path: Path) -> None:
    """The prompt alone does not make the request: the same prompt with another ``max_tokens``
    would end elsewhere, so its id does not resume it."""
    async def scenario() -> list[tuple[int, bytes]]:
        async with two_routers(tmp_path) as (d, _, b, _):
            whole = await read(await d.router.handler(request()))
            some = next(i for i, m in whole if i is not None and not i.endswith(":end"))
            out = []
            for router in (d.router, b):
                response = await router.handler(request(some, max_tokens=39))
                out.append((response.status, response.body))
            return out

    for status, body in loop.run(scenario()):
        assert status == 409
        assert json.loads(body)["error"]["code"] == "last_event_id_mismatch"
