"""Fuzzing the drafter (``POST assignments``), the router (``PUT instances/{id}/status``,
``POST events``) and the router's OpenAI-compatible front end (``v1/...``) through their
handlers, in process.

SDCP answers are checked by :func:`~.fuzzkit.check_answer`; the front end's by its own
contract (an OpenAI-style JSON error with its status, never a 5xx or a traceback). State: a
refused assignment leaves the drafter's sessions as they were; a refused status report or
event leaves the router's table of instances and its routed sessions as they were.
"""

from __future__ import annotations

import asyncio
import json
import random
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import tests.protocol.message_strategies as ms
from sdcp_fast.protocol import MEDIA_TYPE, Assignment, Event, SdcpProblem, Status, instance_path_id
from sdcp_fast.protocol.messages import ROLE_DRAFTER, ROLE_VERIFIER
from sdcp_fast.protocol.peer import Peer, PeerRole
from sdcp_fast.roles.frontend import mount_frontend
from sdcp_fast.roles.frontend_text import ToyWords
from sdcp_fast.roles.router import RouterRole, SessionSpec
from sdcp_fast.transport.base import Request
from sdcp_fast.transport.inprocess import InProcessNetwork
from tests.roles.rolekit import (
    DRAFTER,
    DRAFTER_PEER,
    ROUTER,
    ROUTER_PEER,
    SCOPE,
    TARGET,
    TOKENIZER,
    VERIFIER,
    VERIFIER_PEER,
    Clock,
    Rig,
)

from .fuzzkit import (
    EXAMPLES,
    ODD_VALUES,
    PER_EXAMPLE,
    check_answer,
    decoder_problem,
    mutate,
    reshape,
    variants,
)

SETTINGS = settings(max_examples=EXAMPLES, derandomize=True, database=None, deadline=None,
                    suppress_health_check=list(HealthCheck), phases=[Phase.explicit, Phase.generate])
CLIENT_PEER = Peer("https://client.test/", PeerRole.CLIENT)


class Loop:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(asyncio.wait_for(coro, 30))


class DrafterRig(Loop):
    """A drafter role at DRAFTER; the verifier its assignments name is not reachable, so a valid
    assignment starts a session that proposes into the void (and is later cancelled)."""

    def __init__(self, root: str) -> None:
        super().__init__()
        self.rig = Rig(root)
        self.run(self.rig.__aenter__())
        self.role = self.run(self.rig.drafter_role(retries=0))

    def close(self) -> None:
        self.run(self.rig.__aexit__(None, None, None))
        self.loop.close()


class RouterRig(Loop):
    """A router with a live verifier (which reported) and one routed session, plus the front end."""

    def __init__(self, root: str) -> None:
        super().__init__()
        self.rig = Rig(root)
        self.run(self.rig.__aenter__())
        self.router = RouterRole(uri=ROUTER, mlc=self.rig.store, transport=self.rig.network.transport(ROUTER_PEER),
                                 target_digest=TARGET, tokenizer_digest=TOKENIZER, scope=SCOPE, clock=Clock(),
                                 drafter_models={DRAFTER: b"a" * 32})
        self.rig.network.register(ROUTER, self.router.handler)
        self.run(self.rig.client(VERIFIER_PEER).status(ROUTER, Status(instance=VERIFIER, role=ROLE_VERIFIER, load=0,
                                                                      queue=0, ttl_ms=10**9)))
        self.routed = self.run(self.router.open(SessionSpec(prompt=(1, 2, 3), max_new=4)))

    def state(self) -> Any:
        """The routed sessions and the status table (a refused report changes neither)."""
        now = self.router.clock()
        statuses = {instance: self.router.table.status(instance, now) for instance in (DRAFTER, VERIFIER)}
        return (sorted((k, (r.epoch, r.verifier, r.drafter, r.round)) for k, r in self.router.sessions.items()),
                statuses)

    def close(self) -> None:
        self.run(self.rig.__aexit__(None, None, None))
        self.loop.close()


@pytest.fixture(scope="module")
def drafter_rig(tmp_path_factory: pytest.TempPathFactory) -> Any:
    rig = DrafterRig(str(tmp_path_factory.mktemp("fuzz-drafter")))
    yield rig
    rig.close()


@pytest.fixture(scope="module")
def router_rig(tmp_path_factory: pytest.TempPathFactory) -> Any:
    rig = RouterRig(str(tmp_path_factory.mktemp("fuzz-router")))
    yield rig
    rig.close()


def _sdcp(rig: Loop, handler: Any, requests: list[tuple[Request, str | None]], allowed: set[str],
          decode_as: type[Any], state: Any = None) -> None:
    for request, expect in requests:
        before = state() if state else None
        response = rig.run(handler(request))
        if expect is None and response.status >= 400:
            problem = decoder_problem(decode_as, request.body)
            expect = None if problem is None else problem.suffix
        check_answer(response, allowed=allowed, expect=expect, context=request)
        if state is not None and response.status >= 400:
            now = state()
            if isinstance(now, dict):  # sessions may end on their own meanwhile, never begin or change
                assert all(now[k] == before[k] for k in now) and set(now) <= set(before), \
                    f"state changed by a refused {request}"
            else:
                assert now == before, f"state changed by a refused {request}"


def _bodies(method: str, path: str, bodies: Any, rng: random.Random, peer: Peer,
            wrong: list[Peer]) -> list[tuple[Request, str | None]]:
    headers = {"content-type": MEDIA_TYPE}
    out: list[tuple[Request, str | None]] = []
    for i, body in enumerate(bodies):
        if i % 17 == 16:
            out.append((Request(method, path, body=body, headers=headers, peer=rng.choice(wrong)), "sdcp-forbidden"))
        else:
            out.append((Request(method, path, body=body, headers=headers, peer=peer), None))
    return out


@SETTINGS
@given(message=ms.assignments, seed=st.integers(0, 2**32 - 1))
def test_post_assignments(drafter_rig: DrafterRig, message: Assignment, seed: int) -> None:
    rng = random.Random(seed)
    if rng.random() < 0.6:
        message = replace(message, drafter=DRAFTER, verifier="inproc://nowhere/",
                          prompt=message.prompt if rng.random() < 0.5 else tuple(rng.randrange(64) for _ in range(3)))
    sessions = drafter_rig.role._sessions

    def state() -> Any:  # the assignments held (earlier sessions may end on their own meanwhile)
        return {k: v.record.assignment for k, v in sessions.items()}

    requests = _bodies("POST", "assignments", variants(message, rng, PER_EXAMPLE), rng, ROUTER_PEER,
                       [DRAFTER_PEER, VERIFIER_PEER, CLIENT_PEER, Peer(None, None)])
    _sdcp(drafter_rig, drafter_rig.role.handler, requests,
          {"sdcp-bad-request", "sdcp-forbidden", "sdcp-bad-contract", "mlc-unavailable"}, Assignment, state)


@SETTINGS
@given(message=ms.statuses, seed=st.integers(0, 2**32 - 1))
def test_put_status(router_rig: RouterRig, message: Status, seed: int) -> None:
    rng = random.Random(seed)
    peer, role = rng.choice([(DRAFTER_PEER, ROLE_DRAFTER), (VERIFIER_PEER, ROLE_VERIFIER)])
    if rng.random() < 0.7:
        message = replace(message, instance=peer.uri, role=role if rng.random() < 0.8 else message.role)
    try:
        path = f"instances/{instance_path_id(message.instance)}/status"
    except SdcpProblem:  # an instance name that has no path id: a path naming something else
        path = "instances/AAAA/status"
    requests = _bodies("PUT", path, variants(message, rng, PER_EXAMPLE), rng, peer,
                       [ROUTER_PEER, CLIENT_PEER, Peer(None, None)])
    _sdcp(router_rig, router_rig.router.handler, requests, {"sdcp-bad-request", "sdcp-forbidden"}, Status,
          router_rig.state)


@SETTINGS
@given(message=ms.events, seed=st.integers(0, 2**32 - 1))
def test_post_events(router_rig: RouterRig, message: Event, seed: int) -> None:
    rng = random.Random(seed)
    if rng.random() < 0.5:  # about the routed session, from its verifier or another one
        message = replace(message, session=router_rig.routed.session)
    peer = rng.choice([VERIFIER_PEER, Peer("inproc://verifier/other/", PeerRole.VERIFIER)])
    requests = _bodies("POST", "events", variants(message, rng, PER_EXAMPLE), rng, peer,
                       [ROUTER_PEER, DRAFTER_PEER, CLIENT_PEER, Peer(None, None)])
    _sdcp(router_rig, router_rig.router.handler, requests, {"sdcp-bad-request", "sdcp-forbidden"}, Event)


# -- the front end --------------------------------------------------------------------------

_JSON = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(), st.text(max_size=20)),
                     lambda inner: st.one_of(st.lists(inner, max_size=4),
                                             st.dictionaries(st.text(max_size=12), inner, max_size=4)), max_leaves=12)
_REQUESTS = st.fixed_dictionaries({
    "model": st.sampled_from(["sdcp-fast", "other"]),
    "prompt": st.one_of(st.text(max_size=40), st.lists(st.integers(-3, 70), max_size=6)),
    "messages": st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "system"]), "content": st.text(max_size=20)}),
                         max_size=3),
}, optional={
    "max_tokens": st.one_of(st.integers(-2, 6), st.just(10**12)), "temperature": st.floats(-1, 3),
    "top_p": st.floats(-1, 2), "top_k": st.integers(-1, 2**65), "seed": st.integers(-1, 2**65),
    "stream": st.one_of(st.booleans(), st.just("yes")), "stop": st.one_of(st.text(max_size=8), _JSON),
    "n": st.integers(0, 3), "sdcp_session": st.one_of(st.text(max_size=34), st.just("ab" * 16)), "extra": _JSON,
})


class FrontRig(Loop):
    """A router and its front end with no live verifier: every request that passes validation is
    refused for want of one, so inputs test the parsing and validation surface quickly."""

    def __init__(self, root: str) -> None:
        super().__init__()
        self.network = InProcessNetwork()
        from sdcp_fast.store import embedded

        self.mlc = embedded(root)
        self.router = RouterRole(uri=ROUTER, mlc=self.mlc, transport=self.network.transport(ROUTER_PEER),
                                 target_digest=TARGET, tokenizer_digest=TOKENIZER, scope=SCOPE, clock=Clock(),
                                 drafter_models={})
        mount_frontend(self.router, ToyWords(), stop=())


@pytest.fixture(scope="module")
def front_rig(tmp_path_factory: pytest.TempPathFactory) -> Any:
    rig = FrontRig(str(tmp_path_factory.mktemp("fuzz-front")))
    yield rig
    rig.mlc.close()
    rig.loop.close()


# v1/completions and v1/chat/completions each get INPUTS (45% of 20/9 times the examples' bodies
# each, plus v1/models and routes that do not exist).
@settings(SETTINGS, max_examples=20 * EXAMPLES // 9 + 1)
@given(body=_REQUESTS, seed=st.integers(0, 2**32 - 1))
def test_frontend_v1(front_rig: FrontRig, body: dict[str, Any], seed: int) -> None:
    rng = random.Random(seed)
    encoded = json.dumps(body).encode()
    for i in range(PER_EXAMPLE):
        path = rng.choices(["v1/completions", "v1/chat/completions", "v1/models", "v1/embeddings", "v1/x/../models"],
                           [45, 45, 4, 3, 3])[0]
        if i == 0:
            raw = encoded
        elif i % 3 == 1:
            reshaped = reshape(body, rng)
            try:
                raw = json.dumps(reshaped, default=repr).encode()
            except (ValueError, TypeError):
                raw = mutate(encoded, rng)
        else:
            raw = mutate(encoded, rng)
        method = "GET" if path == "v1/models" and rng.random() < 0.8 else rng.choice(["POST", "POST", "PUT", "GET"])
        request = Request(method, path, body=raw, headers={"content-type": "application/json"},
                          peer=rng.choice([None, CLIENT_PEER]))
        response = front_rig.run(front_rig.router.handler(request))
        assert response.status < 500 or response.status == 503, (response.status, response.body[:300], request)
        assert b"Traceback" not in response.body and b'File "/' not in response.body, response.body[:300]
        if response.status >= 400:
            error = json.loads(response.body)
            if "error" in error:  # OpenAI style
                assert isinstance(error["error"]["message"], str) and error["error"]["type"], error
            else:  # the route table's own (405 on a method, 404 elsewhere): an RFC 9457 problem
                check_answer(response, context=request)


def test_odd_values_cover_every_cbor_major_type() -> None:
    """The reshaping values hold every CBOR major type, floats and tags included."""
    kinds = {type(v).__name__ for v in ODD_VALUES}
    assert {"int", "str", "bytes", "bool", "NoneType", "list", "dict", "float", "CBORTag"} <= kinds
