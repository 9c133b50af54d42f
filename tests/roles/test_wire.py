"""SDCP over a transport: the route table (errors as RFC 9457 problems, 204 for no body) and the
typed client (Table 1's method and path for each call, problems matched by type suffix)."""

from __future__ import annotations

import asyncio
import base64
import json

import pytest

from sdcp_fast.protocol import (
    MEDIA_TYPE,
    Action,
    BadRequest,
    Event,
    Output,
    Policy,
    Sampling,
    SdcpProblem,
    SessionState,
    StaleBase,
    instance_path_id,
    session_path_id,
)
from sdcp_fast.protocol.peer import Peer, PeerRole
from sdcp_fast.protocol.problems import BY_SUFFIX, PROBLEM_MEDIA_TYPE, UnlistedProblem
from sdcp_fast.roles.wire import Routes, SdcpClient, decode_body
from sdcp_fast.transport.base import Request, Response
from sdcp_fast.transport.errors import TransportError, TransportTimeout
from sdcp_fast.transport.inprocess import InProcessNetwork
from sdcp_fast.transport.problem import problem_response

from .rolekit import (
    DRAFTER,
    PROMPT,
    ROUTER,
    ROUTER_PEER,
    VERIFIER,
    assignment,
    contract,
    proposal,
    run,
    session_open,
    sid,
)

S = sid(41)
STATE = SessionState(session=S, epoch=1, round=0, committed=0, digest=b"\1" * 32)


def routes() -> Routes:
    table = Routes()

    async def state(request, sid):
        return STATE

    async def nothing(request):
        return None

    async def raw(request):
        return Response(202, b"x", {"content-type": "text/plain"})

    async def bug(request):
        raise KeyError("secret-key-material")

    async def refuse(request):
        raise StaleBase("behind", extra={"session_state": STATE.to_map()})

    table.add("GET", r"sessions/(?P<sid>[^/]+)/state", state)
    table.add("POST", r"nothing", nothing)
    table.add("POST", r"raw", raw)
    table.add("POST", r"bug", bug)
    table.add("POST", r"refuse", refuse)
    return table


def call(method, path, **kw) -> Response:
    return run(routes()(Request(method=method, path=path, **kw)))


def test_routes_answer_messages_none_and_responses():
    ok = call("GET", f"/sessions/{session_path_id(S)}/state")
    assert ok.status == 200 and ok.content_type == MEDIA_TYPE and SessionState.decode(ok.body) == STATE
    empty = call("POST", "nothing")
    assert empty.status == 204 and empty.body == b""
    assert call("POST", "raw").status == 202


@pytest.mark.parametrize(("method", "path", "status"), [
    ("GET", "nowhere", 404), ("GET", "sessions/x/state/more", 404), ("DELETE", "nothing", 405),
    ("PUT", "sessions/x/state", 405)])
def test_unknown_paths_404_and_wrong_methods_405_as_problems(method, path, status):
    """§5.1: errors use Problem Details (RFC 9457)."""
    response = call(method, path)
    assert response.status == status and response.content_type == PROBLEM_MEDIA_TYPE
    body = json.loads(response.body)
    assert body["status"] == status and body["type"] and body["title"]


def test_a_handler_bug_is_a_500_problem_without_a_traceback(caplog):
    response = call("POST", "bug")
    assert response.status == 500 and response.content_type == PROBLEM_MEDIA_TYPE
    text = response.body.decode()
    assert "secret" not in text and "Traceback" not in text and "KeyError" not in text
    assert json.loads(text)["status"] == 500
    assert "secret-key-material" in caplog.text  # logged on the server side instead


def test_a_problem_keeps_its_type_status_and_members():
    """Table 2: the 409 stale-base carries the current session-state (§6.3)."""
    response = call("POST", "refuse")
    body = json.loads(response.body)
    assert response.status == 409 and body["type"].endswith("sdcp-stale-base")
    assert SessionState.from_map({**body["session_state"], "session": S, "digest": b"\1" * 32}) == STATE


def test_direct_routes_answer_alike_in_a_plain_call_and_through_the_table(caplog):
    """A route added with add_direct answers the native server's plain call (answer_now, a
    future's outcome through settled) as its coroutine answers every other server: messages,
    None, problems (counted), and a bug as a 500 without a traceback."""
    seen: list[str] = []

    async def scenario() -> tuple[list[Response], list[Response], list[object]]:
        loop = asyncio.get_running_loop()
        table = Routes()
        table.on_problem = lambda problem: seen.append(problem.suffix)

        def answer(peer, headers, body, query, groups):
            kind = groups["kind"]
            if kind == "refuse":
                raise StaleBase("behind", extra={"session_state": STATE.to_map()})
            if kind == "bug":
                raise KeyError("secret-key-material")
            if kind == "nothing":
                return None
            if kind == "now":
                return STATE
            future = loop.create_future()
            if kind == "later":
                loop.call_soon(future.set_result, STATE)
            elif kind == "later-refused":
                loop.call_soon(future.set_exception, StaleBase("behind"))
            else:
                loop.call_soon(future.set_exception, KeyError("secret-key-material"))
            return future

        table.add_direct("POST", r"direct/(?P<kind>[a-z-]+)", answer)
        table.add("POST", r"plain", lambda request: asyncio.sleep(0, STATE))
        kinds = ["now", "nothing", "refuse", "bug", "later", "later-refused", "later-bug"]
        plain: list[Response] = []
        for kind in kinds:
            got = table.answer_now("POST", f"direct/{kind}", {}, b"", {}, None)
            if isinstance(got, asyncio.Future):
                await asyncio.wait([got])
                got = table.settled(got)
            plain.append(got)  # type: ignore[arg-type]
        awaited = [await table(Request("POST", f"direct/{kind}")) for kind in kinds]
        others = [table.answer_now(m, p, {}, b"", {}, None) for m, p in
                  [("POST", "plain"), ("GET", "direct/now"), ("POST", "nowhere")]]
        return plain, awaited, others

    plain, awaited, others = run(scenario())
    shape = [(r.status, r.content_type, r.body if r.status < 300 else json.loads(r.body)["status"]) for r in plain]
    assert shape == [(r.status, r.content_type, r.body if r.status < 300 else json.loads(r.body)["status"])
                     for r in awaited]
    assert [r.status for r in plain] == [200, 204, 409, 500, 200, 409, 500]
    assert SessionState.decode(plain[4].body) == STATE
    assert others == [None, None, None]  # routes answered only through the table
    assert seen == ["sdcp-stale-base", "sdcp-internal-error"] * 4
    assert "Traceback" not in plain[3].body.decode() and "secret" not in plain[6].body.decode()
    assert "secret-key-material" in caplog.text


def test_decode_body_needs_the_sdcp_media_type():
    """§5.1: bodies are application/sdcp+cbor."""
    body = STATE.encode()
    assert decode_body(SessionState, Request("POST", "x", body=body, headers={"content-type": MEDIA_TYPE})) == STATE
    with pytest.raises(BadRequest):
        decode_body(SessionState, Request("POST", "x", body=body, headers={"content-type": "application/json"}))
    with pytest.raises(BadRequest):
        decode_body(SessionState, Request("POST", "x", body=b"\xff\x00", headers={"content-type": MEDIA_TYPE}))


def test_instance_path_id_is_base64url_without_padding():
    """The {id} of instances/{id} (docs/interpretations.md)."""
    uri = "https://10.0.0.1:8443/sdcp/?a=b"
    text = instance_path_id(uri)
    assert "=" not in text and "/" not in text and "+" not in text
    assert base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)).decode() == uri


def test_the_client_sends_each_resource_to_its_method_and_path():
    """§5.1 Table 1 from the client's side: method, path ({id} base64url), media type."""
    seen = []

    async def record(request: Request) -> Response:
        seen.append((request.method, request.path, request.query.get("from"), request.headers.get("content-type"),
                     request.peer))
        if request.path.endswith("output"):
            return Response(200, Output(session=S, epoch=1, from_=2, tokens=(), final=False).encode(),
                            {"content-type": MEDIA_TYPE})
        if request.method in ("POST", "PUT") and request.path in ("assignments", "events") or "instances" in request.path:
            return Response(204)
        return Response(200, STATE.encode(), {"content-type": MEDIA_TYPE})

    async def scenario():
        network = InProcessNetwork()
        network.register(VERIFIER, record)
        network.register(DRAFTER, record)
        network.register(ROUTER, record)
        client = SdcpClient(network.transport(ROUTER_PEER))
        opened = session_open(S, contract())
        a = assignment(opened, STATE)
        answers = [
            await client.open_session(VERIFIER, opened),
            await client.put_drafter(VERIFIER, a),
            await client.policy(VERIFIER, Policy(session=S, from_round=2, sampling=Sampling(top_k=2))),
            await client.output(VERIFIER, S, 2),
            await client.assign(DRAFTER, a),
            await client.status(ROUTER, proposal(STATE, PROMPT[:1]).status),
            await client.event(ROUTER, Event(session=S, epoch=1, kind=Action.FINISH, committed=0,
                                             digest=b"\1" * 32)),
        ]
        return answers

    answers = run(scenario())
    pid = session_path_id(S)
    assert [(m, p) for m, p, *_ in seen] == [
        ("POST", "sessions"), ("PUT", f"sessions/{pid}/drafter"), ("POST", f"sessions/{pid}/policy"),
        ("GET", f"sessions/{pid}/output"), ("POST", "assignments"),
        ("PUT", f"instances/{instance_path_id(DRAFTER)}/status"), ("POST", "events")]
    assert seen[3][2] == "2" and seen[3][3] is None  # GET has no body, from=n in the query
    assert all(ct == MEDIA_TYPE for m, p, _, ct, _ in seen if m != "GET")
    assert all(peer == Peer(ROUTER, PeerRole.ROUTER) for *_, peer in seen)
    assert answers[:3] == [STATE] * 3 and isinstance(answers[3], Output) and answers[4:] == [None] * 3


@pytest.mark.parametrize("suffix", sorted(BY_SUFFIX))
def test_the_client_raises_the_problem_it_received_by_type_suffix(suffix):
    """Table 2 (and our own types): matched on the type URI's suffix, under any base."""
    cls = BY_SUFFIX[suffix]

    async def answer(request):
        body = {"type": f"https://example.net/problems/{suffix}", "title": "t", "status": cls.status,
                "detail": "d", "session_state": {"round": 1}}
        return Response(cls.status, json.dumps(body).encode(), {"content-type": PROBLEM_MEDIA_TYPE})

    async def scenario():
        network = InProcessNetwork()
        network.register(VERIFIER, answer)
        client = SdcpClient(network.transport(Peer(DRAFTER, PeerRole.DRAFTER)))
        with pytest.raises(SdcpProblem) as exc:
            await client.propose(VERIFIER, proposal(STATE, [1]))
        return exc.value

    problem = run(scenario())
    assert type(problem) is cls and problem.suffix == suffix and problem.extra == {"session_state": {"round": 1}}


@pytest.mark.parametrize(("status", "body", "ctype"), [
    (503, b"busy", "text/plain"), (418, b'{"type": "urn:x:unknown"}', PROBLEM_MEDIA_TYPE),
    (502, b"not json", PROBLEM_MEDIA_TYPE)])
def test_unlisted_answers_are_handled_by_status_class(status, body, ctype):
    """§5.1: clients handle unlisted status codes by class (RFC 9110)."""

    async def answer(request):
        return Response(status, body, {"content-type": ctype})

    async def scenario():
        network = InProcessNetwork()
        network.register(VERIFIER, answer)
        with pytest.raises(SdcpProblem) as exc:
            await SdcpClient(network.transport(ROUTER_PEER)).output(VERIFIER, S, 0)
        return exc.value

    problem = run(scenario())
    assert isinstance(problem, UnlistedProblem) and problem.status == status


def test_problem_response_renders_rfc9457():
    response = problem_response(BadRequest("no"))
    assert response.status == 400 and response.content_type == PROBLEM_MEDIA_TYPE
    assert json.loads(response.body)["detail"] == "no"


@pytest.mark.parametrize(("raised", "expected"), [
    (TransportError("stream reset"), ConnectionError), (TransportError("refused", retryable=True), ConnectionError),
    (TransportTimeout("no response within 1 s"), TimeoutError)])
def test_no_response_from_the_network_transport_is_a_connection_error(raised, expected):
    """§6.9: every caller treats "no response" alike on every transport: the network
    transport's errors reach the roles as ConnectionError (TimeoutError for a timeout), the
    errors they retry or fail over on, as the in-process transport's Unreachable does."""

    class Failing:
        async def request(self, *args, **kw):
            raise raised

    async def scenario():
        with pytest.raises(expected) as exc:
            await SdcpClient(Failing()).output(VERIFIER, S, 0)
        return exc.value

    assert isinstance(run(scenario()), expected)
