"""The verifier role through its handler: Table 1's verifier resources, Table 2's problems
from real requests, authorization from the peer, the session registry, idempotent proposals,
output long-polls, policy updates, commit before release, fencing and internal errors."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace

import pytest
import torch

from sdcp_fast.cache import ObjectUnavailable, object_uri
from sdcp_fast.cache.uri import writer_tag
from sdcp_fast.model.interfaces import ScoreRequest
from sdcp_fast.model.toy import WORDS
from sdcp_fast.protocol import (
    MEDIA_TYPE,
    Output,
    Policy,
    Sampling,
    SdcpProblem,
    SessionState,
    Verdict,
    extend_digest,
    session_path_id,
)
from sdcp_fast.protocol.commitlog import CommitRecord, FenceRecord
from sdcp_fast.protocol.messages import RULE_SPECULATIVE
from sdcp_fast.protocol.peer import Peer, PeerRole
from sdcp_fast.protocol.problems import PROBLEM_MEDIA_TYPE
from sdcp_fast.roles.objects import pack_tokens, unpack_tokens
from sdcp_fast.roles.verifier import VerifierRole
from sdcp_fast.store.logs import ThreadedLog

from .rolekit import (
    DRAFTER,
    OTHER,
    PROMPT,
    ROUTER_PEER,
    SCOPE,
    VERIFIER,
    AnsweredNow,
    Rig,
    assignment,
    contract,
    d0,
    proposal,
    run,
    session_open,
    sid,
)

S = sid(1)


@pytest.fixture(autouse=True, params=["general", "direct"])
def answered(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test here runs through the route table's coroutines and through its direct answers."""
    if request.param == "direct":
        monkeypatch.setattr(VerifierRole, "handler", property(lambda role: AnsweredNow(role.routes)))
    return str(request.param)


def suffix_status(exc: pytest.ExceptionInfo[SdcpProblem]) -> tuple[str, int]:
    return exc.value.suffix, exc.value.status


# -- Table 1 ----------------------------------------------------------------------------------


def test_every_verifier_resource_answers_its_message(tmp_path):
    """§5.1 Table 1: POST sessions -> session-state, PUT drafter -> session-state, POST proposals
    -> verdict, GET output -> output, POST policy -> session-state; all application/sdcp+cbor."""

    async def scenario():
        async with Rig(str(tmp_path)) as rig:
            c = contract()
            opened = session_open(S, c)
            state = await rig.router.open_session(VERIFIER, opened)
            assert isinstance(state, SessionState)
            assert (state.round, state.committed, state.digest, state.epoch) == (0, 0, d0(c), 1)
            state = await rig.router.put_drafter(VERIFIER, assignment(opened, state))
            assert isinstance(state, SessionState) and state.round == 0
            tokens = rig.greedy_after(state, 3)
            verdict = await rig.drafter.propose(VERIFIER, proposal(state, tokens))
            assert isinstance(verdict, Verdict)
            assert verdict.accepted == 3 and verdict.committed == 4 and verdict.round == 1
            assert verdict.digest == extend_digest(d0(c), verdict.emitted)
            out = await rig.router.output(VERIFIER, S, 0)
            assert isinstance(out, Output) and out.tokens == verdict.emitted and out.epoch == 1
            state = await rig.router.policy(VERIFIER, Policy(session=S, from_round=3, sampling=Sampling(top_k=5)))
            assert isinstance(state, SessionState) and state.round == 1
            # The bytes on the wire: the SDCP media type and the base64url {id} of §5.1.
            raw = await rig.network.transport(ROUTER_PEER).request(
                VERIFIER, "GET", f"sessions/{session_path_id(S)}/output", query={"from": "1"})
            assert raw.status == 200 and raw.content_type == MEDIA_TYPE
            assert Output.decode(raw.body).tokens == verdict.emitted[1:]

    run(scenario())


def test_a_finished_session_refuses_a_new_drafter_and_a_policy(tmp_path):
    """A session that reached max_new is closed like a failed one: PUT .../drafter and POST
    .../policy answer 410 sdcp-session-closed with the final session-state, and change
    neither who may propose nor the output."""

    async def scenario():
        async with Rig(str(tmp_path)) as rig:
            opened, state = await rig.open(S, contract(max_new=3), m_init=2)
            verdict = await rig.drafter.propose(VERIFIER, proposal(state, rig.greedy_after(state, 2)))
            assert verdict.committed == 3
            reassigned = await _problem(rig.router.put_drafter(
                VERIFIER, assignment(opened, state, drafter=OTHER, m_init=1)))
            policy = await _problem(rig.router.policy(
                VERIFIER, Policy(session=S, from_round=5, sampling=Sampling(top_k=1))))
            out = await rig.router.output(VERIFIER, S, 0)
            return reassigned, policy, out, verdict, rig.verifier.sessions.get(S)

    reassigned, policy, out, verdict, core = run(scenario())
    for suffix, status, extra in (reassigned, policy):
        assert (suffix, status) == ("sdcp-session-closed", 410)
        assert extra["session_state"]["committed"] == 3
    assert core.drafter == DRAFTER and core.sampling_for(5) == core.contract.sampling
    assert out.final and out.tokens == verdict.emitted


# -- Table 2 ----------------------------------------------------------------------------------


async def _problem(coro) -> tuple[str, int, dict]:
    with pytest.raises(SdcpProblem) as exc:
        await coro
    return exc.value.suffix, exc.value.status, exc.value.extra


def test_table2_problems_from_real_requests(tmp_path):
    """§6.3 and Table 2: each problem type with its status, produced by a request that earns it."""

    async def scenario():
        async with Rig(str(tmp_path)) as rig:
            seen = {}
            opened, state = await rig.open(S, contract(max_new=6), m_init=2)
            good = rig.greedy_after(state, 2)
            seen["stale-epoch"] = await _problem(rig.drafter.propose(VERIFIER, proposal(state, good, epoch=2)))
            seen["stale-base"] = await _problem(rig.drafter.propose(
                VERIFIER, proposal(state, good, base=1, base_digest=b"\0" * 32)))
            seen["stale-round"] = await _problem(rig.drafter.propose(VERIFIER, proposal(state, good, round=5)))
            seen["limit"] = await _problem(rig.drafter.propose(VERIFIER, proposal(state, [*good, good[0]])))
            vocab = rig.scorer.vocab_size
            seen["outside-vocab"] = await _problem(rig.drafter.propose(VERIFIER, proposal(state, [good[0], vocab])))
            seen["not-assigned"] = await _problem(rig.other.propose(VERIFIER, proposal(state, good, drafter=OTHER)))
            seen["bad-contract"] = await _problem(rig.router.open_session(
                VERIFIER, session_open(sid(2), contract(target=b"\1" * 32))))
            # Nothing above changed the session: the right proposal still commits round 1.
            verdict = await rig.drafter.propose(VERIFIER, proposal(state, good))
            assert verdict.round == 1 and verdict.accepted == 2
            # max_new = 6: round 2 ends the session; a proposal after it finds it closed.
            verdict = await rig.drafter.propose(VERIFIER, proposal(verdict, rig.greedy_after(verdict, 2)))
            assert verdict.committed == 6
            seen["session-closed"] = await _problem(rig.drafter.propose(VERIFIER, proposal(verdict, [1])))

            # Rule 2: rows that cannot be obtained, and a proposed token its rows give q = 0.
            c2 = contract(RULE_SPECULATIVE)
            _, state2 = await rig.open(sid(3), c2, m_init=2)
            missing = object_uri(SCOPE, sid(3), "q_rows", 1)
            seen["q-unavailable"] = await _problem(rig.drafter.propose(VERIFIER, proposal(state2, [4, 5], q_rows=missing)))
            rows = torch.full((2, vocab), 1.0 / (vocab - 1))
            rows[1, 5] = 0.0
            zero = rig.put_q(sid(3), 1, rows)
            seen["q-zero"] = await _problem(rig.drafter.propose(VERIFIER, proposal(state2, [4, 5], q_rows=zero)))
            seen["outside-vocab-2"] = await _problem(rig.drafter.propose(
                VERIFIER, proposal(state2, [4, vocab + 3], q_rows=rig.uniform_q(sid(3), 1, 2))))
            verdict = await rig.drafter.propose(VERIFIER, proposal(state2, [4, 5], q_rows=rig.uniform_q(sid(3), 1, 2)))
            assert verdict.round == 1
            return seen, rig.scorer.scored

    seen, scored = run(scenario())
    vocab = len(WORDS)
    expected = {
        "stale-epoch": ("sdcp-stale-epoch", 409), "stale-base": ("sdcp-stale-base", 409),
        "stale-round": ("sdcp-stale-base", 409), "limit": ("sdcp-limit", 422),
        "outside-vocab": ("sdcp-bad-proposal", 422), "not-assigned": ("sdcp-not-assigned", 403),
        "bad-contract": ("sdcp-bad-contract", 422), "session-closed": ("sdcp-session-closed", 410),
        "q-unavailable": ("sdcp-q-unavailable", 409), "q-zero": ("sdcp-bad-proposal", 422),
        "outside-vocab-2": ("sdcp-bad-proposal", 422),
    }
    assert {k: v[:2] for k, v in seen.items()} == expected
    # The stale-base problems carry the current session-state (§6.3), for resynchronizing.
    for key in ("stale-base", "stale-round"):
        state = seen[key][2]["session_state"]
        assert state["round"] == 0 and state["committed"] == 0
    # Refused rounds were never scored (a token outside V never reaches the scorer).
    assert len(scored) == 3 and all(max(tokens) < vocab for _, tokens in scored)


def test_problem_bodies_are_rfc9457(tmp_path):
    """§5.1: errors are Problem Details with the Table 2 type, status and session-state."""

    async def scenario():
        async with Rig(str(tmp_path)) as rig:
            _, state = await rig.open(S)
            body = proposal(state, [1], base=3).encode()
            return await rig.network.transport(Peer(DRAFTER, PeerRole.DRAFTER)).request(
                VERIFIER, "POST", "proposals", body=body, headers={"content-type": MEDIA_TYPE})

    response = run(scenario())
    assert response.status == 409 and response.content_type == PROBLEM_MEDIA_TYPE
    body = json.loads(response.body)
    assert body["type"].endswith(":sdcp-stale-base") and body["status"] == 409
    assert body["session_state"]["committed"] == 0


# -- authorization ------------------------------------------------------------------------


def test_authorization_comes_from_the_peer_not_the_proposal(tmp_path):
    """§6.3 Authorization: the authenticated client must be the assigned drafter. A drafter
    certificate of another instance naming the assigned drafter in the body is refused 403
    sdcp-not-assigned, before the epoch check (a wrong epoch does not change the answer)."""

    async def scenario():
        async with Rig(str(tmp_path)) as rig:
            _, state = await rig.open(S)
            forged = proposal(state, rig.greedy_after(state, 2), drafter=DRAFTER)
            first = await _problem(rig.other.propose(VERIFIER, forged))
            stale = await _problem(rig.other.propose(VERIFIER, replace(forged, epoch=7)))
            roleless = await _problem(rig.client(Peer(DRAFTER, None)).propose(VERIFIER, forged))
            anonymous = await _problem(rig.client(None).propose(VERIFIER, forged))
            verdict = await rig.drafter.propose(VERIFIER, forged)
            return first, stale, roleless, anonymous, verdict

    first, stale, roleless, anonymous, verdict = run(scenario())
    assert first[:2] == stale[:2] == ("sdcp-not-assigned", 403)
    assert roleless[1] == anonymous[1] == 403
    assert verdict.round == 1


@pytest.mark.parametrize("call", ["open", "put_drafter", "policy"])
def test_a_drafter_cannot_act_as_the_router(tmp_path, call):
    """Peer identity (docs/interpretations.md): a drafter certificate acts only as a drafter:
    POST sessions, PUT drafter and POST policy from it are 403 sdcp-forbidden."""

    async def scenario():
        async with Rig(str(tmp_path)) as rig:
            opened, state = await rig.open(S, drafter=None)
            if call == "open":
                coro = rig.drafter.open_session(VERIFIER, session_open(sid(2), contract()))
            elif call == "put_drafter":
                coro = rig.drafter.put_drafter(VERIFIER, assignment(opened, state))
            else:
                coro = rig.drafter.policy(VERIFIER, Policy(session=S, from_round=2, sampling=Sampling(top_k=3)))
            problem = await _problem(coro)
            # Nothing changed: no drafter was assigned, no second session exists.
            assert rig.verifier.sessions.get(S).drafter is None and len(rig.verifier.sessions) == 1
            return problem

    assert run(scenario())[:2] == ("sdcp-forbidden", 403)


# -- session registry ---------------------------------------------------------------------


def test_post_sessions_is_idempotent_and_epochs_order_reopens(tmp_path):
    """§6.1/§6.9 session registry: the same session-open twice answers the same state and
    changes nothing; a higher epoch re-opens (proposals of the old epoch are stale); a lower
    epoch is 409 sdcp-stale-epoch; an unknown session is 404 sdcp-unknown-session."""

    async def scenario():
        async with Rig(str(tmp_path)) as rig:
            c = contract()
            opened, state = await rig.open(S, c)
            again = await rig.router.open_session(VERIFIER, opened)
            assert again == state
            verdict = await rig.drafter.propose(VERIFIER, proposal(state, rig.greedy_after(state, 2)))
            # Sent again after a round: the current state, and the round stays committed.
            again = await rig.router.open_session(VERIFIER, opened)
            assert (again.round, again.committed, again.digest) == (1, verdict.committed, verdict.digest)
            different = await _problem(rig.router.open_session(VERIFIER, replace(opened, prompt=(1, 2))))
            assert different[:2] == ("sdcp-bad-request", 400)

            reopened = replace(opened, epoch=2)
            state2 = await rig.router.open_session(VERIFIER, reopened)
            assert (state2.epoch, state2.round, state2.committed) == (2, 0, 0)
            old = await _problem(rig.drafter.propose(VERIFIER, proposal(verdict, [1])))
            lower = await _problem(rig.router.open_session(VERIFIER, opened))
            unknown_output = await _problem(rig.router.output(VERIFIER, sid(9), 0))
            unknown_drafter = await _problem(rig.router.put_drafter(
                VERIFIER, assignment(session_open(sid(9), c), state2)))
            return old, lower, unknown_output, unknown_drafter

    old, lower, unknown_output, unknown_drafter = run(scenario())
    assert old[:2] == ("sdcp-not-assigned", 403)  # the epoch-2 session has no drafter yet
    assert lower[:2] == ("sdcp-stale-epoch", 409)
    assert unknown_output[:2] == unknown_drafter[:2] == ("sdcp-unknown-session", 404)


def test_a_reopen_at_a_higher_epoch_refuses_the_old_epochs_proposals(tmp_path):
    """§6.9: after a re-open with a higher epoch, a proposal of the older epoch is stale."""

    async def scenario():
        async with Rig(str(tmp_path)) as rig:
            opened, state = await rig.open(S)
            opened2 = replace(opened, epoch=2)
            state2 = await rig.router.open_session(VERIFIER, opened2)
            await rig.router.put_drafter(VERIFIER, assignment(opened2, state2))
            old = await _problem(rig.drafter.propose(VERIFIER, proposal(state, rig.greedy_after(state, 1))))
            verdict = await rig.drafter.propose(VERIFIER, proposal(state2, rig.greedy_after(state2, 1)))
            return old, verdict

    old, verdict = run(scenario())
    assert old[:2] == ("sdcp-stale-epoch", 409)
    assert verdict.epoch == 2 and verdict.round == 1


# -- idempotent proposals -----------------------------------------------------------------


def test_concurrent_identical_proposals_share_one_verdict_and_one_scoring(tmp_path):
    """§6.3 Idempotency: an identical request for the round being verified waits for that
    verdict; a replay after the verdict returns the recorded verdict unchanged (§6.9)."""

    async def scenario():
        async with Rig(str(tmp_path)) as rig:
            _, state = await rig.open(S, contract(RULE_SPECULATIVE))
            p = proposal(state, [4, 5, 6], q_rows=rig.uniform_q(S, 1, 3))
            a, b = await asyncio.gather(rig.drafter.propose(VERIFIER, p), rig.drafter.propose(VERIFIER, p))
            replayed = await rig.drafter.propose(VERIFIER, replace(p, status=replace(p.status, load=50)))
            log = rig.store.logs.log(object_uri(SCOPE, S, "commit_log")).read().records
            return a, b, replayed, rig.scorer.scored, log

    a, b, replayed, scored, log = run(scenario())
    assert a == b == replayed
    assert scored == [(S, (4, 5, 6))]
    assert [r.round for r in log if isinstance(r, CommitRecord)] == [1]


# -- output ---------------------------------------------------------------------------------


def test_output_long_poll_by_index_with_many_readers(tmp_path):
    """§6.7: GET output?from=n returns the tokens at indices n and later, waits when none are
    available, and never duplicates or skips; readers starting anywhere see the same output."""

    async def reader(rig, start):
        got, index = [], start
        while True:
            out = await rig.router.output(VERIFIER, S, index)
            assert out.from_ == index
            got.extend(out.tokens)
            index += len(out.tokens)
            if out.final:
                return got

    async def scenario():
        async with Rig(str(tmp_path), output_wait=5.0) as rig:
            _, state = await rig.open(S, contract(max_new=12), m_init=3)
            readers = [asyncio.create_task(reader(rig, start)) for start in (0, 0, 1, 2, 5, 7, 11)]
            await asyncio.sleep(0)
            verdict = state
            while verdict.committed < 12:
                verdict = await rig.drafter.propose(VERIFIER, proposal(verdict, rig.greedy_after(verdict, 3)))
                await asyncio.sleep(0)  # readers run between rounds
            results = await asyncio.gather(*readers)
            return results, rig.output_of(S)

    results, output = run(scenario())
    assert len(output) == 12
    assert results == [output[s:] for s in (0, 0, 1, 2, 5, 7, 11)]


def test_a_rounds_proposal_and_output_are_answered_directly(tmp_path, answered):
    """The round's two requests (its proposal, its output poll) are answered in plain calls
    with futures: the poll waiting on the session is woken by the commit, and the handler's
    coroutines serve only the other routes."""
    if answered != "direct":
        pytest.skip("the direct answers' own path")

    async def scenario():
        async with Rig(str(tmp_path), output_wait=30.0) as rig:
            _, state = await rig.open(S)
            handler = rig.network.handler(VERIFIER)
            assert isinstance(handler, AnsweredNow)
            polls = [asyncio.create_task(rig.router.output(VERIFIER, S, start)) for start in (0, 1, 5)]
            await asyncio.sleep(0.05)
            assert not any(poll.done() for poll in polls)
            verdict = await rig.drafter.propose(VERIFIER, proposal(state, rig.greedy_after(state, 3)))
            woken = await asyncio.wait_for(asyncio.gather(*polls[:2]), 5.0)
            assert not polls[2].done()  # the commit released fewer tokens than it waits for
            polls[2].cancel()
            again = await rig.drafter.propose(VERIFIER, proposal(state, rig.greedy_after(state, 3)))
            return verdict, woken, again, handler.general

    verdict, woken, again, general = run(scenario())
    assert [out.tokens for out in woken] == [verdict.emitted, verdict.emitted[1:]]
    assert again == verdict  # the recorded verdict, answered at once
    assert general == ["POST sessions"]


def test_output_waits_then_answers_empty_not_final(tmp_path):
    """§6.7: with nothing new, GET output waits up to the server's time and then answers an
    empty, non-final output; a commit during the wait answers at once."""

    async def scenario():
        async with Rig(str(tmp_path), output_wait=0.05) as rig:
            _, state = await rig.open(S)
            t0 = asyncio.get_running_loop().time()
            empty = await rig.router.output(VERIFIER, S, 0)
            waited = asyncio.get_running_loop().time() - t0
            rig.configure(output_wait=30.0)
            pending = asyncio.create_task(rig.router.output(VERIFIER, S, 0))
            await asyncio.sleep(0)
            assert not pending.done()
            verdict = await rig.drafter.propose(VERIFIER, proposal(state, rig.greedy_after(state, 2)))
            woken = await asyncio.wait_for(pending, 5.0)
            beyond = 0.01
            rig.configure(output_wait=beyond)
            past = await rig.router.output(VERIFIER, S, 10)
            return empty, waited, woken, verdict, past, beyond

    empty, waited, woken, verdict, past, _ = run(scenario())
    assert empty.tokens == () and not empty.final and waited >= 0.04
    assert woken.tokens == verdict.emitted and not woken.final
    assert past.tokens == () and past.from_ == 10 and not past.final


def test_output_polls_with_different_deadlines_each_answer_at_their_own(tmp_path):
    """Polls waiting at once with different deadlines (the server's wait changed between
    them) answer empty in the order of their deadlines, each no sooner than its own; one
    still waiting when a round commits answers that round's tokens at once; and the
    deadlines of the answered polls do not wake a later one early."""

    async def scenario():
        async with Rig(str(tmp_path)) as rig:
            _, state = await rig.open(S)
            loop = asyncio.get_running_loop()
            answered: list[tuple[float, float]] = []
            polls = []
            t0 = loop.time()
            for wait in (0.30, 0.10, 0.20, 30.0):
                rig.configure(output_wait=wait)

                async def poll(wait=wait):
                    out = await rig.router.output(VERIFIER, S, 0)
                    answered.append((wait, loop.time() - t0))
                    return out

                polls.append(asyncio.create_task(poll()))
                await asyncio.sleep(0.01)  # the handler has read its wait
            empties = await asyncio.wait_for(asyncio.gather(*polls[:3]), 5.0)
            assert not polls[3].done()
            verdict = await rig.drafter.propose(VERIFIER, proposal(state, rig.greedy_after(state, 2)))
            woken = await asyncio.wait_for(polls[3], 5.0)
            rig.configure(output_wait=0.05)
            t1 = loop.time()
            late = await rig.router.output(VERIFIER, S, len(woken.tokens))
            return empties, answered, woken, verdict, late, loop.time() - t1

    empties, answered, woken, verdict, late, late_wait = run(scenario())
    assert all(out.tokens == () and not out.final for out in empties)
    assert [w for w, _ in answered] == [0.10, 0.20, 0.30, 30.0]
    assert all(at >= w for w, at in answered[:3])
    assert woken.tokens == verdict.emitted and answered[3][1] < 5.0
    assert late.tokens == () and late_wait >= 0.045


def test_output_from_must_be_a_uint(tmp_path):
    async def scenario():
        async with Rig(str(tmp_path)) as rig:
            await rig.open(S)
            return await rig.network.transport(ROUTER_PEER).request(
                VERIFIER, "GET", f"sessions/{session_path_id(S)}/output", query={"from": "-1"})

    response = run(scenario())
    assert response.status == 400 and json.loads(response.body)["type"].endswith("sdcp-bad-request")


# -- policy ---------------------------------------------------------------------------------


def test_policy_update_changes_sampling_from_its_round(tmp_path):
    """§6.6: a policy applies to rounds from_round and later; earlier rounds keep the
    contract's profile; from_round not after the current round is refused."""
    c = contract(RULE_SPECULATIVE, sampling=Sampling(temperature_milli=2000, seed=3))

    async def three_rounds(root, policy):
        async with Rig(root) as rig:
            _, state = await rig.open(S, c, m_init=2)
            verdicts, refused = [], None
            verdict = state
            for r in (1, 2, 3):
                if r == 2 and policy:
                    await rig.router.policy(VERIFIER, Policy(session=S, from_round=3, sampling=Sampling(top_k=1)))
                    refused = await _problem(rig.router.policy(
                        VERIFIER, Policy(session=S, from_round=1, sampling=Sampling(top_k=2))))
                # Propose the token the target likes least: under top_k = 1 it cannot pass.
                row = rig.target.score([ScoreRequest(
                    S, [*PROMPT, *rig.output_of(S)], [])])[0][0]
                worst = int(torch.argmin(row))
                verdict = await rig.drafter.propose(VERIFIER, proposal(verdict, [worst], q_rows=rig.uniform_q(S, r, 1)))
                verdicts.append((verdict, int(torch.argmax(row))))
            return verdicts, refused

    plain, _ = run(three_rounds(str(tmp_path / "a"), False))
    updated, refused = run(three_rounds(str(tmp_path / "b"), True))
    assert [v for v, _ in updated[:2]] == [v for v, _ in plain[:2]]  # rounds 1, 2: the contract's profile
    third, argmax = updated[2]
    assert third.accepted == 0 and third.emitted == (argmax,)  # round 3: top_k = 1
    assert refused[:2] == ("sdcp-bad-request", 400)


# -- commit before release ------------------------------------------------------------------


class FlakyLog:
    """A commit log whose next append fails as an unreachable store's would."""

    def __init__(self, log, released=None):
        self.log = log
        self.fail_next = False
        self.released = released  # what the verifier has released, looked at as each append starts
        self.seen_at_append = []

    def append(self, record, etag):
        if self.released is not None:
            self.seen_at_append.append((record.committed - len(record.emitted), len(self.released())))
        if self.fail_next:
            self.fail_next = False
            raise OSError("store unreachable")
        return self.log.append(record, etag)

    def __getattr__(self, name):
        return getattr(self.log, name)


def test_commit_record_precedes_the_verdict_and_committed_tokens_follow_output(tmp_path):
    """§6.3 Commit: the record is in the log before the verdict is released; a failed append
    releases nothing. The log alone holds the output after every commit: the committed_tokens
    object (roles/objects.py) is not rewritten each round; it is written, equal to the output,
    when the session ends (roles/verifier_commit.py)."""

    async def scenario():
        async with Rig(str(tmp_path)) as rig:
            logs = []
            real = rig.store.logs.log

            async def commit_log(name):
                logs.append(FlakyLog(real(name), released=lambda: rig.output_of(S)))
                return ThreadedLog(logs[-1])

            rig.store.commit_log = commit_log
            _, state = await rig.open(S, contract(max_new=16), m_init=3)
            tokens_ref = object_uri(SCOPE, S, "committed_tokens", 1, tag=writer_tag(VERIFIER))
            checks = []
            verdict = state
            for r in range(4):
                if r == 2:
                    logs[0].fail_next = True
                    refused = await _problem(rig.drafter.propose(
                        VERIFIER, proposal(verdict, rig.greedy_after(verdict, 3))))
                    checks.append(("refused", refused[1], rig.output_of(S), len(logs[0].read().records)))
                verdict = await rig.drafter.propose(VERIFIER, proposal(verdict, rig.greedy_after(verdict, 3)))
                records = [x for x in real(object_uri(SCOPE, S, "commit_log")).read().records]
                last = records[-1]
                assert isinstance(last, CommitRecord)
                assert (last.round, last.emitted, last.committed, last.digest) == (
                    verdict.round, verdict.emitted, verdict.committed, verdict.digest)
                output = rig.output_of(S)
                if r < 3:
                    with pytest.raises(ObjectUnavailable):
                        rig.mlc.get(tokens_ref)
                else:  # round 3 ends the session: the object holds the whole output
                    assert rig.mlc.get(tokens_ref).tobytes() == pack_tokens(output)
                assert [t for x in records for t in x.emitted] == output
            # Each append started with only the earlier rounds released: nothing before its record.
            assert all(before == released for before, released in logs[0].seen_at_append)
            assert len(logs[0].seen_at_append) == 5
            return checks

    [(_, status, output, records)] = run(scenario())
    assert status >= 500  # the drafter retries it (§6.9); nothing was released
    assert len(output) == 8 and records == 2


def test_committed_tokens_format_is_uint32_big_endian():
    """docs/interpretations.md "MLC objects": uint32 in network byte order, concatenated."""
    assert pack_tokens([1, 258, 2**32 - 1]) == bytes.fromhex("00000001" "00000102" "ffffffff")
    assert unpack_tokens(bytes.fromhex("0000000100000102")) == (1, 258)
    with pytest.raises(SdcpProblem):
        unpack_tokens(b"\0\0\0")
    with pytest.raises(SdcpProblem):
        pack_tokens([2**32])


# -- fencing --------------------------------------------------------------------------------


def test_a_fenced_log_stops_the_session_and_fails_the_waiting_proposal(tmp_path):
    """§6.3/§6.8: an append after a fence of a newer epoch fails; the verifier discards the
    round, releases nothing, answers the waiting proposal sdcp-stale-epoch and stops serving."""

    async def scenario():
        async with Rig(str(tmp_path)) as rig:
            _, state = await rig.open(S)
            verdict = await rig.drafter.propose(VERIFIER, proposal(state, rig.greedy_after(state, 2)))
            log = rig.store.logs.log(object_uri(SCOPE, S, "commit_log"))
            # A fail-over elsewhere fences the log while round 2 is being scored.
            rig.scorer.on_score = lambda batch: log.append(FenceRecord(epoch=2), None)
            waiting = await _problem(rig.drafter.propose(VERIFIER, proposal(verdict, rig.greedy_after(verdict, 2))))
            rig.scorer.on_score = None
            after = await _problem(rig.drafter.propose(VERIFIER, proposal(verdict, [1])))
            output = await _problem(rig.router.output(VERIFIER, S, 0))
            tokens = unpack_tokens(rig.mlc.get(object_uri(SCOPE, S, "committed_tokens", 1, tag=writer_tag(VERIFIER))))
            return verdict, waiting, after, output, tokens, log.read().records

    verdict, waiting, after, output, tokens, records = run(scenario())
    assert waiting[:2] == after[:2] == output[:2] == ("sdcp-stale-epoch", 409)
    # Round 2 released nothing: the output refuses, and the object (written before each append, so
    # it may hold the fenced round too) is read by its committed prefix only (docs/roles.md).
    assert tokens[: verdict.committed] == verdict.emitted
    assert [type(r).__name__ for r in records] == ["CommitRecord", "FenceRecord"]


# -- the route table ------------------------------------------------------------------------


def test_unknown_paths_and_wrong_methods_are_problems(tmp_path):
    """§5.1: errors are RFC 9457 problems: 404 for a path no resource has, 405 for a method
    the resource does not take."""

    async def scenario():
        async with Rig(str(tmp_path)) as rig:
            t = rig.network.transport(ROUTER_PEER)
            return (await t.request(VERIFIER, "GET", "nothing/here"), await t.request(VERIFIER, "GET", "proposals"),
                    await t.request(VERIFIER, "DELETE", f"sessions/{session_path_id(S)}/output"))

    missing, wrong, wrong2 = run(scenario())
    assert missing.status == 404 and missing.content_type == PROBLEM_MEDIA_TYPE
    assert wrong.status == wrong2.status == 405 and wrong.content_type == PROBLEM_MEDIA_TYPE
    assert json.loads(wrong.body)["status"] == 405


def test_a_failure_below_the_handler_answers_500_without_a_traceback(tmp_path):
    """A bug (here, a store that raises something no caller expects) answers a 500 problem
    whose body holds neither a traceback nor the exception's text."""

    async def scenario():
        async with Rig(str(tmp_path)) as rig:
            async def broken(uri):
                raise RuntimeError("secret internal state")

            rig.store.get = broken
            opened = session_open(S, contract(), prompt=object_uri(SCOPE, S, "prompt"))
            return await rig.network.transport(ROUTER_PEER).request(
                VERIFIER, "POST", "sessions", body=opened.encode(), headers={"content-type": MEDIA_TYPE})

    response = run(scenario())
    assert response.status == 500 and response.content_type == PROBLEM_MEDIA_TYPE
    text = response.body.decode()
    assert "Traceback" not in text and "secret" not in text and "RuntimeError" not in text
    assert json.loads(text)["status"] == 500


def test_a_prompt_by_reference_is_read_from_the_mlc(tmp_path):
    """§5.2 prompt as a cache-ref: the verifier reads the token object (roles/objects.py)."""

    async def scenario():
        async with Rig(str(tmp_path)) as rig:
            ref = object_uri(SCOPE, S, "prompt")
            rig.mlc.put(ref, pack_tokens(PROMPT))
            c = contract()
            state = await rig.router.open_session(VERIFIER, session_open(S, c, prompt=ref))
            missing = await _problem(rig.router.open_session(
                VERIFIER, session_open(sid(2), c, prompt=object_uri(SCOPE, sid(2), "prompt"))))
            return state, d0(c), missing

    state, expected, missing = run(scenario())
    assert state.digest == expected
    assert missing[:2] == ("sdcp-bad-request", 400)


def test_status_reports_measured_batch_occupancy_and_queue(tmp_path):
    """§5.2 status and the verdict's load: the verifier's load is measured (batch occupancy of
    recent passes, its queue; the GPU where NVML is present), not a constant."""

    async def scenario():
        async with Rig(str(tmp_path), max_batch=2) as rig:
            idle = rig.verifier.status()
            _, state = await rig.open(S, contract(max_new=12), m_init=3)
            verdict = state
            while verdict.committed < 12:
                verdict = await rig.drafter.propose(VERIFIER, proposal(verdict, rig.greedy_after(verdict, 3)))
            return idle, rig.verifier.status(), verdict, rig.verifier.load.gpu.why == ""

    idle, busy, verdict, nvml = run(scenario())
    assert (idle.load == 0 or nvml) and idle.queue == 0 and idle.instance == VERIFIER
    assert busy.load >= 30 and busy.queue == 0  # every pass held 1 of 2 sessions
    assert 0 < verdict.load <= 100


def test_malformed_requests_are_400_not_500(tmp_path):
    """§5.1/§5.2: a path id that is not base64url of 16 bytes, a body that is not
    application/sdcp+cbor or not a message, and a message for another session than its path
    are the client's errors (400 sdcp-bad-request), never a 500."""

    async def scenario():
        async with Rig(str(tmp_path)) as rig:
            opened, state = await rig.open(sid(2))
            t = rig.network.transport(ROUTER_PEER)
            cbor = {"content-type": MEDIA_TYPE}
            elsewhere = assignment(session_open(S, contract()), state)
            return [
                await t.request(VERIFIER, "GET", "sessions/not*base64/output"),
                await t.request(VERIFIER, "GET", f"sessions/{session_path_id(S)[:-2]}/output"),
                await t.request(VERIFIER, "POST", "sessions", body=opened.encode(),
                                headers={"content-type": "application/json"}),
                await t.request(VERIFIER, "POST", "sessions", body=b"\xa1\x00", headers=cbor),
                await t.request(VERIFIER, "PUT", f"sessions/{session_path_id(sid(2))}/drafter",
                                body=elsewhere.encode(), headers=cbor),
            ]

    responses = run(scenario())
    assert [r.status for r in responses] == [400] * 5
    assert all(json.loads(r.body)["type"].endswith("sdcp-bad-request") for r in responses)


def test_a_cancel_answers_the_pending_output_polls_at_once(tmp_path):
    """A router's cancel ends the session here: an output poll already waiting on it answers
    sdcp-unknown-session at once, without holding the event loop until its deadline (it once
    spun there, freezing the verifier for the whole wait)."""

    async def scenario():
        async with Rig(str(tmp_path), output_wait=30.0) as rig:
            await rig.open(S)
            poll = asyncio.create_task(_problem(rig.router.output(VERIFIER, S, 0)))
            await asyncio.sleep(0.05)
            assert not poll.done()
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            ticks = 0

            async def ticker():
                nonlocal ticks
                while True:
                    await asyncio.sleep(0.01)
                    ticks += 1

            ticking = asyncio.create_task(ticker())
            await rig.router.cancel(VERIFIER, S)
            answer = await asyncio.wait_for(poll, 5.0)
            elapsed = loop.time() - t0
            await asyncio.sleep(0.1)
            ticking.cancel()
            return answer, elapsed, ticks

    answer, elapsed, ticks = run(scenario())
    assert answer[:2] == ("sdcp-unknown-session", 404)
    assert elapsed < 5.0 and ticks >= 3
