"""Event ids at a stream's end (roles/frontend.py, docs/frontend.md "Resuming a stream"): the
last text event carries its token index, so a client cut off after it resumes to learn the
finish; an index beyond the session's output is refused before the stream begins."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sdcp_fast.roles.sse import DONE, event_id
from sdcp_fast.transport import loop

from .test_frontend_resume import read, request, text, two_routers


def test_the_last_text_event_has_its_index_and_resuming_after_it_gives_the_finish(tmp_path: Path) -> None:
    async def scenario() -> tuple[list[tuple[str | None, Any]], list[tuple[str | None, Any]]]:
        async with two_routers(tmp_path) as (d, _, _, _):
            whole = await read(await d.router.handler(request(max_tokens=12, stream_options={"include_usage": True})))
            texts = [i for i, m in whole if m != DONE and m.get("choices") and m["choices"][0]["text"]]
            rest = await read(await d.router.handler(request(texts[-1], max_tokens=12,
                                                             stream_options={"include_usage": True})))
            return whole, rest

    whole, rest = loop.run(scenario())
    session = bytes.fromhex(str(whole[0][0]).split(":")[0])
    last_text = max(i for i, (_, m) in enumerate(whole) if m != DONE and m["choices"] and m["choices"][0]["text"])
    ident, finish = whole[last_text + 1]
    usage = whole[-2][1]
    assert whole[last_text][0] == event_id(session, usage["usage"]["completion_tokens"])
    assert finish["choices"][0]["finish_reason"] in ("stop", "length") and ident == event_id(session, None)
    assert [m for _, m in rest][-1] == DONE and text(rest) == ""
    assert rest[0][1]["choices"][0]["finish_reason"] == finish["choices"][0]["finish_reason"]
    assert rest[1][1]["usage"] == usage["usage"]


def test_an_index_beyond_the_output_is_400_invalid_last_event_id(tmp_path: Path) -> None:
    async def scenario() -> tuple[int, Any, int]:
        async with two_routers(tmp_path) as (d, _, _, _):
            whole = await read(await d.router.handler(request(max_tokens=12)))
            session = str(whole[0][0]).split(":")[0]
            beyond = await d.router.handler(request(f"{session}:999", max_tokens=12))
            good = await d.router.handler(request(f"{session}:1", max_tokens=12))
            await read(good)
            return beyond.status, json.loads(beyond.body), good.status

    status, body, good = loop.run(scenario())
    assert status == 400 and body["error"]["code"] == "invalid_last_event_id"
    assert good == 200  # the refused resume left the session resumable
