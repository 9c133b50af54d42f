"""Fuzzing the verifier's five resources (Table 1) through its handler, in process.

Two live sessions (rule 1 with committed rounds, rule 2) sit in the verifier throughout. Every
input is checked by :func:`~.fuzzkit.check_answer`, and after each one the committed state of
both sessions (output and commit log) is compared with before: it may change only by a round
the same request was answered 200 for, and then exactly by that verdict's emitted tokens.
"""

from __future__ import annotations

import asyncio
import base64
import random
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import tests.protocol.message_strategies as ms
from sdcp_fast.cache import object_uri
from sdcp_fast.protocol import MEDIA_TYPE, Assignment, Output, Policy, Proposal, SessionOpen, Verdict
from sdcp_fast.protocol.messages import RULE_SPECULATIVE, session_path_id
from sdcp_fast.protocol.peer import Peer, PeerRole
from sdcp_fast.transport.base import Request, Response
from tests.roles.rolekit import (
    DRAFTER,
    DRAFTER_PEER,
    OTHER_PEER,
    ROUTER_PEER,
    SCOPE,
    TARGET,
    VERIFIER_PEER,
    Rig,
    contract,
    proposal,
    sid,
)

from .fuzzkit import EXAMPLES, PER_EXAMPLE, check_answer, decoder_problem, mutate, variants

# No shrinking: a failure reports its generated message and seed, which repeat it.
SETTINGS = settings(max_examples=EXAMPLES, derandomize=True, database=None, deadline=None,
                    suppress_health_check=list(HealthCheck), phases=[Phase.explicit, Phase.generate])
CLIENT_PEER = Peer("https://client.test/", PeerRole.CLIENT)
PEERS_NOT = {  # callers a resource must refuse before reading the body
    "router": [DRAFTER_PEER, VERIFIER_PEER, CLIENT_PEER, Peer(None, None)],
    "drafter": [ROUTER_PEER, VERIFIER_PEER, CLIENT_PEER, Peer(None, None)],
}
# A proposal from any client but a drafter is §6.3's "403 with problem type sdcp-not-assigned".
REFUSED_AS = {"router": "sdcp-forbidden", "drafter": "sdcp-not-assigned"}
COMMON = {"sdcp-bad-request", "sdcp-forbidden", "sdcp-unknown-session", "sdcp-stale-epoch"}
ANSWERS = {
    "sessions": COMMON | {"sdcp-bad-contract"},
    "drafter": COMMON | {"sdcp-bad-contract", "sdcp-session-closed"},
    "proposals": COMMON | {"sdcp-bad-contract", "sdcp-not-assigned", "sdcp-stale-base", "sdcp-limit",
                           "sdcp-bad-proposal", "sdcp-q-unavailable", "sdcp-session-closed"},
    "policy": COMMON | {"sdcp-bad-contract", "sdcp-session-closed"},
    "output": {"sdcp-bad-request", "sdcp-unknown-session", "sdcp-not-found", "sdcp-forbidden"},
}


class FuzzRig:
    """A verifier with a rule-1 session (three committed rounds) and a rule-2 session, on its
    own event loop, kept for all the examples of one test."""

    def __init__(self, root: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.rig = Rig(root, output_wait=0.0)
        self.loop.run_until_complete(self.rig.__aenter__())
        self.live: dict[bytes, Any] = {}
        self.states: dict[bytes, Any] = {}
        self.run(self._open())

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(asyncio.wait_for(coro, 30))

    async def _open(self) -> None:
        rig = self.rig
        for n, rule in ((1, 1), (2, RULE_SPECULATIVE)):
            opened, state = await rig.open(sid(n), contract(rule, max_new=1_000_000))
            self.live[opened.session] = opened
            self.states[opened.session] = state
        state = self.states[sid(1)]
        for _ in range(3):
            state = await rig.drafter.propose(rig.verifier.uri, proposal(state, rig.greedy_after(state, 3)))
        self.states[sid(1)] = state

    def close(self) -> None:
        self.run(self.rig.__aexit__(None, None, None))
        self.loop.close()

    def snapshot(self) -> dict[bytes, tuple[tuple[int, ...] | None, int]]:
        out = {}
        for session in self.live:
            core = self.rig.verifier.sessions.get(session)
            if core.epoch != self.live[session].epoch:
                # Re-opened at a higher epoch by a (fuzzing) router: a fail-over, which starts
                # the verifier's view afresh by design (§6.9); the log keeps every record.
                self.live[session] = replace(self.live[session], epoch=core.epoch)
            tokens = tuple(core.output(0).tokens) if core.epoch == 1 else None
            records = self.rig.store.logs.log(object_uri(SCOPE, session, "commit_log")).read(0).records
            out[session] = (tokens, len(records))
        return out

    def send(self, request: Request) -> tuple[Response, list[Any]]:
        """The answer, and the rounds this request committed."""
        before = len(self.rig.rounds)
        response = self.run(self.rig.verifier.handler(request))
        return response, self.rig.rounds[before:]

    def current(self, session: bytes) -> Any:
        return self.rig.verifier.sessions.get(session).session_state()


@pytest.fixture(scope="module")
def fuzz_rig(tmp_path_factory: pytest.TempPathFactory) -> Any:
    rig = FuzzRig(str(tmp_path_factory.mktemp("fuzz-verifier")))
    yield rig
    rig.close()


def drive(rig: FuzzRig, requests: list[tuple[Request, Any]], allowed: set[str],
          decode_as: type[Any] | None) -> None:
    """Send each request and check its answer; a refused or replayed request commits no round,
    and over the batch the committed state moved by exactly the verdicts answered 200."""
    before = rig.snapshot()
    moved: dict[bytes, list[int]] = {session: [] for session in before}
    for request, expect in requests:
        response, rounds = rig.send(request)
        if expect is None and decode_as is not None and response.status >= 400:
            problem = decoder_problem(decode_as, request.body)
            expect = None if problem is None else problem.suffix
        if expect not in (None, "sdcp-forbidden") and request.path.startswith("sessions/"):
            expect = {expect, "sdcp-unknown-session"}  # sessions/{id} is looked up before the body is read
        check_answer(response, allowed=allowed, expect=expect,
                     context=request)
        if response.status != 200 or not rounds:
            assert not rounds, "a round was committed for a refused request"
            continue
        assert request.path == "proposals" and len(rounds) == 1
        verdict = Verdict.decode(response.body)
        assert rounds[0].emitted == verdict.emitted and rounds[0].round == verdict.round
        moved[verdict.session].extend(verdict.emitted)
        moved.setdefault(b"rounds:" + verdict.session, []).append(verdict.round)
    after = rig.snapshot()
    for session, (tokens, records) in before.items():
        rounds = len(moved.get(b"rounds:" + session, []))
        if tokens is None or after[session][0] is None:  # re-opened: no record may be lost or added
            assert after[session][1] == records + rounds
            continue
        assert after[session] == (tokens + tuple(moved[session]), records + rounds)


def _requests(method: str, path: str, bodies: Any, rng: random.Random, role: str,
              peer: Peer) -> list[tuple[Request, str | None]]:
    out: list[tuple[Request, str | None]] = []
    headers = {"content-type": MEDIA_TYPE}
    for i, body in enumerate(bodies):
        if i % 17 == 16:  # a caller whose certificate gives another role: refused before the body is read
            out.append((Request(method, path, body=body, headers=headers, peer=rng.choice(PEERS_NOT[role])),
                        REFUSED_AS[role]))
        elif i % 23 == 22:
            out.append((Request(method, path, body=body, headers={"content-type": "application/json"}, peer=peer),
                        "sdcp-bad-request"))
        else:
            out.append((Request(method, path, body=body, headers=headers, peer=peer), None))
    return out


def _anchor_open(rig: FuzzRig, message: SessionOpen, rng: random.Random) -> SessionOpen:
    choice = rng.randrange(4)
    if choice == 0:
        return message
    live = rig.live[rng.choice(list(rig.live))]
    c = replace(message.contract, target=TARGET) if rng.random() < 0.7 else message.contract
    if choice == 1:  # the live session's id at its epoch or below: never replaces it
        return replace(message, session=live.session, epoch=rng.randint(0, live.epoch), contract=c)
    if choice == 2:  # the very session-open again: idempotent
        return live
    return replace(message, contract=c, epoch=1, prompt=tuple(rng.randrange(64) for _ in range(rng.randint(0, 9))),
                   commit_log=object_uri(SCOPE, bytes(message.session), "commit_log"), resume=None)


@SETTINGS
@given(message=ms.session_opens, seed=st.integers(0, 2**32 - 1))
def test_post_sessions(fuzz_rig: FuzzRig, message: SessionOpen, seed: int) -> None:
    rng = random.Random(seed)
    message = _anchor_open(fuzz_rig, message, rng)
    bodies = variants(message, rng, PER_EXAMPLE)
    drive(fuzz_rig, _requests("POST", "sessions", bodies, rng, "router", ROUTER_PEER), ANSWERS["sessions"],
          SessionOpen)


@SETTINGS
@given(message=ms.assignments, seed=st.integers(0, 2**32 - 1))
def test_put_drafter(fuzz_rig: FuzzRig, message: Assignment, seed: int) -> None:
    rng = random.Random(seed)
    session = rng.choice([*fuzz_rig.live, bytes(message.session)])
    if session in fuzz_rig.live and rng.random() < 0.8:
        live = fuzz_rig.live[session]
        # Anchored, but naming the live drafter, so that the sessions stay proposable.
        message = replace(message, session=session, epoch=live.epoch if rng.random() < 0.8 else message.epoch,
                          contract=live.contract if rng.random() < 0.5 else message.contract, drafter=DRAFTER)
    path = f"sessions/{session_path_id(session)}/drafter"
    bodies = variants(message, rng, PER_EXAMPLE)
    drive(fuzz_rig, _requests("PUT", path, bodies, rng, "router", ROUTER_PEER), ANSWERS["drafter"], Assignment)


@SETTINGS
@given(message=ms.proposals, seed=st.integers(0, 2**32 - 1))
def test_post_proposals(fuzz_rig: FuzzRig, message: Proposal, seed: int) -> None:
    rng = random.Random(seed)
    choice = rng.randrange(5)
    if choice:
        session = rng.choice(list(fuzz_rig.live))
        state = fuzz_rig.current(session)
        message = replace(message, session=session, epoch=state.epoch if choice > 1 else message.epoch,
                          drafter=DRAFTER)
        if choice > 2:  # on the committed prefix: only the tokens (and rows) can be wrong
            message = replace(message, round=state.round + 1, base=state.committed, base_digest=state.digest)
            if choice == 4:
                m = rng.randint(1, 10)
                tokens = fuzz_rig.rig.greedy_after(state, m) if rng.random() < 0.5 else \
                    [rng.choice([rng.randrange(64), rng.randrange(1 << 32)]) for _ in range(m)]
                message = replace(message, tokens=tuple(tokens))
    bodies = variants(message, rng, PER_EXAMPLE)
    requests = _requests("POST", "proposals", bodies, rng, "drafter", DRAFTER_PEER)
    requests.append((Request("POST", "proposals", body=message.encode(), headers={"content-type": MEDIA_TYPE},
                             peer=OTHER_PEER), None))  # a drafter that is not assigned
    drive(fuzz_rig, requests, ANSWERS["proposals"], Proposal)


@SETTINGS
@given(message=ms.policies, seed=st.integers(0, 2**32 - 1))
def test_post_policy(fuzz_rig: FuzzRig, message: Policy, seed: int) -> None:
    rng = random.Random(seed)
    session = rng.choice([*fuzz_rig.live, bytes(message.session)])
    if rng.random() < 0.7:
        message = replace(message, session=session)
    path = f"sessions/{session_path_id(session)}/policy"
    bodies = variants(message, rng, PER_EXAMPLE)
    drive(fuzz_rig, _requests("POST", path, bodies, rng, "router", ROUTER_PEER), ANSWERS["policy"], Policy)


_IDS = st.one_of(st.text(max_size=30), st.binary(min_size=0, max_size=20).map(
    lambda b: base64.urlsafe_b64encode(b).rstrip(b"=").decode()))
_FROM = st.one_of(st.integers(0, 50).map(str), st.integers(0, 2**70).map(str), st.text(max_size=12),
                  st.just("-1"), st.just("１２"), st.just(""))


@SETTINGS
@given(ident=_IDS, start=_FROM, seed=st.integers(0, 2**32 - 1))
def test_get_output(fuzz_rig: FuzzRig, ident: str, start: str, seed: int) -> None:
    rng = random.Random(seed)
    sessions = list(fuzz_rig.live)
    requests = []
    for i in range(PER_EXAMPLE):
        path_id = session_path_id(rng.choice(sessions)) if i % 2 == 0 else \
            (ident if i == 1 else mutate(ident.encode(), rng).decode("latin-1"))
        query = {"from": start if i % 4 < 2 else str(rng.randrange(40))}
        peer = rng.choice([ROUTER_PEER, CLIENT_PEER, DRAFTER_PEER, None])
        requests.append(Request("GET", f"sessions/{path_id}/output", query=query, peer=peer))
    drive(fuzz_rig, [(request, None) for request in requests], ANSWERS["output"], None)
    for request in requests[::2]:  # the live sessions: exactly the committed tokens from the index asked
        response, _ = fuzz_rig.send(request)
        if response.status == 200:
            out = Output.decode(response.body)
            committed = fuzz_rig.rig.verifier.sessions.get(out.session).output(0).tokens
            assert out.tokens == tuple(committed[out.from_:]) and out.from_ == int(request.query["from"])
