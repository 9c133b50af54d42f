"""roles/verifier_commit.py: how events reach the router (§6.5), tried again on no answer or a
5xx, never after a 4xx, and with no wait after the last try; and the committed_tokens object,
written when a reader needs it and never rewritten each round."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import pytest

from sdcp_fast.cache import ObjectUnavailable, object_uri
from sdcp_fast.cache.uri import writer_tag
from sdcp_fast.protocol import Action, Event, Resume
from sdcp_fast.protocol.commitlog import CommitRecord, FenceRecord
from sdcp_fast.protocol.problems import BadRequest, InternalError
from sdcp_fast.roles import retry
from sdcp_fast.roles.objects import unpack_tokens
from sdcp_fast.roles.verifier_commit import EVENT_ATTEMPTS, RELEASE_STEP, Committer, output_of_log
from sdcp_fast.roles.verifier_config import VerifierConfig, VerifierContext

from .rolekit import OTHER, SCOPE, VERIFIER, Rig, assignment, contract, proposal, run, sid
from .test_metrics import samples, value

S = sid(7)

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
    config = VerifierConfig(uri=VERIFIER, target_digest=b"", router="inproc://router/")
    context = VerifierContext(store=stub, objects=stub, load=stub, metrics=stub, background=stub, clock=lambda: 0.0)
    committer = Committer(config, context, kv=stub, client=stub)
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


# -- the committed_tokens object: written when a reader needs it, never each round --------------


def _counting_puts(rig: Any) -> list[tuple[str, int]]:
    puts: list[tuple[str, int]] = []
    real = rig.store.put

    async def put(uri: str, data: Any, lease_ttl: float | None = None) -> str | None:
        if "/committed_tokens/" in uri:
            puts.append((uri, len(bytes(data))))
        return await real(uri, data, lease_ttl)

    rig.store.put = put
    return puts


def test_committed_tokens_bytes_per_round_do_not_grow_with_the_session(tmp_path):
    """No round rewrites the committed output: what the verifier writes per round is the same at
    4 committed tokens and at 400 (nothing), and the whole output is written once, at the end."""

    async def scenario():
        async with Rig(str(tmp_path)) as rig:
            puts = _counting_puts(rig)
            _, state = await rig.open(S, contract(max_new=400, m_max=8), m_init=3)
            verdict, during = state, []
            while verdict.committed < 400:
                verdict = await rig.drafter.propose(VERIFIER, proposal(verdict, rig.greedy_after(verdict, 3)))
                during.append(len(puts))
            return puts, during, rig.output_of(S)

    puts, during, output = run(scenario())
    assert len(during) == 100 and set(during[:-1]) == {0}
    assert puts == [(object_uri(SCOPE, S, "committed_tokens", 1, tag=writer_tag(VERIFIER)), 4 * len(output))]


def test_a_drafter_assigned_mid_session_finds_the_object_written(tmp_path):
    """The router's PUT sessions/{id}/drafter for a session with committed tokens writes this
    epoch's object before it answers, so the assignment that follows can name it."""

    async def scenario():
        async with Rig(str(tmp_path)) as rig:
            opened, state = await rig.open(S, contract(max_new=40))
            verdict = state
            for _ in range(2):
                verdict = await rig.drafter.propose(VERIFIER, proposal(verdict, rig.greedy_after(verdict, 3)))
            with pytest.raises(ObjectUnavailable):
                rig.mlc.get(object_uri(SCOPE, S, "committed_tokens", 1, tag=writer_tag(VERIFIER)))
            await rig.router.put_drafter(VERIFIER, assignment(opened, verdict, drafter=OTHER))
            written = rig.mlc.get(object_uri(SCOPE, S, "committed_tokens", 1, tag=writer_tag(VERIFIER)))
            return unpack_tokens(written), rig.output_of(S)

    written, output = run(scenario())
    assert list(written) == output and len(output) == 8


def test_a_resume_takes_its_prefix_from_the_log_when_no_object_holds_it(tmp_path):
    """§6.9 fail-over: the log holds every emitted token, so a resume whose committed_tokens
    object was never written still opens at the resumed length and digest."""

    async def scenario():
        async with Rig(str(tmp_path)) as rig:
            opened, state = await rig.open(S, contract(max_new=40))
            verdict = state
            for _ in range(2):
                verdict = await rig.drafter.propose(VERIFIER, proposal(verdict, rig.greedy_after(verdict, 3)))
            before = rig.output_of(S)
            rig.store.logs.log(object_uri(SCOPE, S, "commit_log")).append(FenceRecord(epoch=2), None)
            resumed = replace(opened, epoch=2, resume=Resume(
                round=verdict.round, committed=verdict.committed, digest=verdict.digest,
                committed_tokens=object_uri(SCOPE, S, "committed_tokens", 1)))
            state = await rig.router.open_session(VERIFIER, resumed)
            return before, state, rig.output_of(S)

    before, state, after = run(scenario())
    assert state.committed == len(before) == 8 and after == before


def test_output_of_log_follows_each_record_to_its_committed_length() -> None:
    d = b"\0" * 32
    records = [CommitRecord(epoch=1, round=1, emitted=(1, 2), committed=2, digest=d),
               CommitRecord(epoch=1, round=2, emitted=(3,), committed=3, digest=d),
               FenceRecord(epoch=2),
               CommitRecord(epoch=2, round=3, emitted=(4, 5), committed=5, digest=d)]
    assert output_of_log(records) == [1, 2, 3, 4, 5]
    assert output_of_log([]) == []


# -- group commit: one append call per scoring pass, each round answered by its own outcome --------


async def _verdict_or_problem(call: Any) -> Any:
    from sdcp_fast.protocol import SdcpProblem

    try:
        return await call
    except SdcpProblem as problem:
        return problem.suffix, problem.status


def test_a_pass_appends_its_records_together_and_answers_each_round_by_its_own_append(tmp_path):
    """Three sessions scored in one pass: a fence lands on the first one's log and another
    writer's record on the second's while the pass runs. The pass's three records go to the
    store in one append_batch call, before any of the three rounds is released; the first two
    get sdcp-stale-epoch, as a single append does, and the third is committed and released."""
    sessions = [sid(11), sid(12), sid(13)]

    async def scenario():
        async with Rig(str(tmp_path), batch_wait=5.0) as rig:
            states = {s: (await rig.open(s, contract(max_new=40)))[1] for s in sessions}
            logs = {s: rig.store.logs.log(object_uri(SCOPE, s, "commit_log")) for s in sessions}
            calls: list[tuple[list[bytes], dict[bytes, list[int]]]] = []
            real = rig.store.append_batch

            async def append_batch(entries):
                calls.append(([s for s in sessions for e in entries if e.log.ref == logs[s].ref],
                              {s: rig.output_of(s) for s in sessions}))
                return await real(entries)

            rig.store.append_batch = append_batch

            def on_score(_batch: Any) -> None:
                logs[sessions[0]].append(FenceRecord(epoch=2), None)
                logs[sessions[1]].append(CommitRecord(epoch=1, round=1, emitted=(9,), committed=1, digest=bytes(32)),
                                         None)

            rig.scorer.on_score = on_score
            answers = await asyncio.gather(*(
                _verdict_or_problem(rig.drafter.propose(VERIFIER, proposal(states[s], rig.greedy_after(states[s], 2))))
                for s in sessions))
            fenced = [await _verdict_or_problem(rig.router.output(VERIFIER, s, 0)) for s in sessions[:2]]
            return calls, answers, fenced, rig.output_of(sessions[2]), [r.batch for r in rig.rounds]

    calls, answers, fenced, output, batches = run(scenario())
    assert len(calls) == 1 and calls[0][0] == sessions, "one group append for the pass"
    assert calls[0][1] == {s: [] for s in sessions}, "nothing of the pass released before it"
    assert answers[0] == answers[1] == ("sdcp-stale-epoch", 409)
    assert answers[2].round == 1 and list(answers[2].emitted) == output != []
    assert fenced == [("sdcp-stale-epoch", 409)] * 2, "the fenced sessions release nothing"
    assert batches == [3]


def test_a_large_pass_answers_its_first_rounds_before_it_has_released_the_last(tmp_path):
    """A pass of more than RELEASE_STEP rounds is released a step at a time with the event loop
    running between: the first verdict's callbacks (where a server sends its answer) run when
    one step of the pass is released, not the whole pass. Every round still commits."""
    n = RELEASE_STEP + 8
    sessions = [sid(100 + i) for i in range(n)]

    async def scenario():
        async with Rig(str(tmp_path), batch_wait=5.0, max_batch=n) as rig:
            states = {s: (await rig.open(s, contract(max_new=40)))[1] for s in sessions}
            released_at_answer: list[int] = []
            enqueue = rig.verifier.batcher.enqueue

            def watched(item: Any) -> Any:
                future = enqueue(item)
                future.add_done_callback(lambda _: released_at_answer.append(len(rig.rounds)))
                return future

            rig.verifier.batcher.enqueue = watched
            verdicts = await asyncio.gather(*(
                rig.drafter.propose(VERIFIER, proposal(states[s], rig.greedy_after(states[s], 2))) for s in sessions))
            return verdicts, released_at_answer, [r.batch for r in rig.rounds]

    verdicts, released_at_answer, batches = run(scenario())
    assert batches == [n] * n, "one pass"
    assert [v.round for v in verdicts] == [1] * n
    assert released_at_answer[0] == RELEASE_STEP < n


class _SlowReads:
    """A log whose reads take 50 ms, counting how many are in flight at once."""

    in_flight = peak = 0

    def __init__(self, log: Any) -> None:
        self.log, self.ref = log, log.ref

    async def read(self, start: int = 0) -> Any:
        cls = type(self)
        cls.in_flight += 1
        cls.peak = max(cls.peak, cls.in_flight)
        try:
            await asyncio.sleep(0.05)
            return await self.log.read(start)
        finally:
            cls.in_flight -= 1

    async def append(self, record: Any, if_match: str | None) -> str:
        return await self.log.append(record, if_match)


def test_a_failed_group_append_releases_nothing_and_the_retry_commits(tmp_path):
    """The store gives no answer for the pass: each round is a 5xx with nothing released (the
    logs read back together, not one after another), and the drafters' retries commit them (a
    record that did land is found by the log read)."""
    sessions = [sid(21), sid(22)]

    async def scenario():
        async with Rig(str(tmp_path), batch_wait=5.0) as rig:
            opened = rig.store.commit_log

            async def commit_log(ref: str) -> Any:
                return _SlowReads(await opened(ref))

            rig.store.commit_log = commit_log
            states = {s: (await rig.open(s, contract(max_new=40)))[1] for s in sessions}
            _SlowReads.peak = 0
            real = rig.store.append_batch
            failing = [True]

            async def append_batch(entries):
                if failing[0]:
                    failing[0] = False
                    raise ConnectionError("the MLC is restarting")
                return await real(entries)

            rig.store.append_batch = append_batch
            props = {s: proposal(states[s], rig.greedy_after(states[s], 2)) for s in sessions}
            first = await asyncio.gather(*(_verdict_or_problem(rig.drafter.propose(VERIFIER, props[s]))
                                           for s in sessions))
            released = {s: rig.output_of(s) for s in sessions}
            second = await asyncio.gather(*(_verdict_or_problem(rig.drafter.propose(VERIFIER, props[s]))
                                            for s in sessions))
            return first, released, second, _SlowReads.peak

    first, released, second, reads_at_once = run(scenario())
    assert all(answer[1] >= 500 for answer in first)
    assert reads_at_once == 2
    assert released == {s: [] for s in sessions}
    assert [v.round for v in second] == [1, 1]


def test_a_round_that_ends_its_session_holds_back_no_other_round_of_its_pass(tmp_path):
    """The round that ends a session is released only once the session's whole output is in its
    committed_tokens object; that write holds back neither the other rounds of the pass nor the
    next pass (it is an MLC round trip, in one pass of two at 64 sessions)."""
    ending, going = sid(21), sid(22)

    async def scenario():
        async with Rig(str(tmp_path), batch_wait=5.0) as rig:
            states = {ending: (await rig.open(ending, contract(max_new=4)))[1],
                      going: (await rig.open(going, contract(max_new=40)))[1]}
            written, real = asyncio.Event(), rig.store.put
            held: list[str] = []

            async def put(uri: str, data: Any, lease_ttl: float | None = None) -> str | None:
                if "/committed_tokens/" in uri:
                    held.append(uri)
                    await written.wait()
                return await real(uri, data, lease_ttl)

            rig.store.put = put
            first = {s: asyncio.ensure_future(rig.drafter.propose(VERIFIER, proposal(states[s],
                                                                                    rig.greedy_after(states[s], 3))))
                     for s in (ending, going)}
            going_verdict = await first[going]
            # The next pass runs while the ending session's output is still being written.
            second = await rig.drafter.propose(VERIFIER, proposal(going_verdict, rig.greedy_after(going_verdict, 3)))
            still_waiting, counted_before = not first[ending].done(), _rounds_counted(rig)
            written.set()
            ending_verdict = await first[ending]
            stored = unpack_tokens(rig.mlc.get(held[0]))
            return (still_waiting, held, going_verdict, second, ending_verdict, stored, rig.output_of(ending),
                    counted_before, _rounds_counted(rig))

    still_waiting, held, going_verdict, second, ending_verdict, stored, output, before, after = run(scenario())
    assert still_waiting and len(held) == 1, "the ending round waits for its object, and only it"
    assert (going_verdict.round, second.round) == (1, 2)
    assert ending_verdict.committed == 4 and list(stored) == output and len(output) == 4
    assert (before, after) == (2, 3), "a round is counted as its verdict is released"


def _rounds_counted(rig: Any) -> float:
    return value(samples(rig.verifier.context.metrics.text()), "sdcp_rounds_total")
