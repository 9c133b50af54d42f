"""roles/verifier_commit.py on its own: how events reach the router (§6.5), tried again on no
answer or a 5xx, never after a 4xx, and with no wait after the last try."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from sdcp_fast.protocol import Action, Event
from sdcp_fast.protocol.problems import BadRequest, InternalError
from sdcp_fast.roles import retry
from sdcp_fast.roles.verifier_commit import EVENT_ATTEMPTS, Committer

EVENT = Event(session=b"s" * 16, epoch=1, kind=Action.SWITCH, committed=3, digest=b"\0" * 32)


class Client:
    def __init__(self, answers: list[BaseException | None]) -> None:
        self.answers = answers
        self.calls = 0

    async def event(self, router: str, event: Event) -> None:
        assert router == "inproc://router/" and event == EVENT
        answer = self.answers[min(self.calls, len(self.answers) - 1)]
        self.calls += 1
        if answer is not None:
            raise answer


def _send(monkeypatch: pytest.MonkeyPatch, answers: list[BaseException | None]) -> tuple[int, list[float]]:
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)

    monkeypatch.setattr(retry.asyncio, "sleep", sleep)
    client = Client(answers)
    stub: Any = None
    committer = Committer(objects=stub, store=stub, load=stub, metrics=stub, kv=stub, background=stub,
                          client=stub, router="inproc://router/", clock=lambda: 0.0, on_round=None)
    committer.client = client  # type: ignore[assignment]
    asyncio.run(committer.send_event(EVENT))
    return client.calls, waits


def test_an_event_the_router_never_takes_is_tried_each_time_with_no_wait_after_the_last(monkeypatch):
    calls, waits = _send(monkeypatch, [InternalError("restarting")])
    assert calls == EVENT_ATTEMPTS and len(waits) == EVENT_ATTEMPTS - 1
    assert waits == sorted(waits) and waits[0] > 0


def test_no_answer_is_tried_again_until_the_router_takes_the_event(monkeypatch):
    assert _send(monkeypatch, [ConnectionResetError("gone"), TimeoutError(), None]) == (3, [0.05, 0.1])


def test_a_refused_event_is_not_sent_again(monkeypatch):
    assert _send(monkeypatch, [BadRequest("no such session")]) == (1, [])
