"""Problem types (Table 2) and their RFC 9457 rendering."""

from __future__ import annotations

import json

import pytest

from sdcp_fast.protocol.problems import (
    BY_SUFFIX,
    PROBLEM_TYPE_BASE,
    PROBLEMS,
    BadContract,
    BadProposal,
    BadRequest,
    Forbidden,
    Limit,
    NotAssigned,
    QUnavailable,
    SdcpProblem,
    SessionClosed,
    StaleBase,
    StaleEpoch,
    UnknownSession,
)

TABLE_2 = [
    (StaleEpoch, "sdcp-stale-epoch", 409, "Epoch is not current"),
    (StaleBase, "sdcp-stale-base", 409, "Proposal does not extend the committed prefix"),
    (QUnavailable, "sdcp-q-unavailable", 409, "Draft probabilities required by the rule are unavailable"),
    (BadContract, "sdcp-bad-contract", 422, "Contract invalid or not supported"),
    (Limit, "sdcp-limit", 422, "Proposal violates m_cap or m_max"),
    (SessionClosed, "sdcp-session-closed", 410, "Session has finished or failed"),
    (BadProposal, "sdcp-bad-proposal", 422, "Proposal inconsistent with its draft distributions"),
    (NotAssigned, "sdcp-not-assigned", 403, "Drafter is not assigned to the session"),
]


@pytest.mark.parametrize(("cls", "suffix", "status", "meaning"), TABLE_2, ids=[s for _, s, _, _ in TABLE_2])
def test_table_2(cls: type[SdcpProblem], suffix: str, status: int, meaning: str) -> None:
    assert (cls.suffix, cls.status, cls.title) == (suffix, status, meaning)
    assert BY_SUFFIX[suffix] is cls
    assert cls in PROBLEMS


def test_problems_outside_table_2() -> None:
    assert (BadRequest.suffix, BadRequest.status) == ("sdcp-bad-request", 400)
    assert (UnknownSession.suffix, UnknownSession.status) == ("sdcp-unknown-session", 404)
    assert BadRequest not in PROBLEMS and UnknownSession not in PROBLEMS
    assert (Forbidden.suffix, Forbidden.status) == ("sdcp-forbidden", 403)
    assert len(BY_SUFFIX) == len(TABLE_2) + 3


@pytest.mark.parametrize("cls", [c for c, _, _, _ in TABLE_2] + [BadRequest, UnknownSession])
def test_render_is_rfc9457_json(cls: type[SdcpProblem]) -> None:
    problem = cls("something specific", extra={"digest": b"\x01\x02", "committed": 3})
    body = json.loads(problem.render())
    assert body["type"] == PROBLEM_TYPE_BASE + cls.suffix == problem.type_uri
    assert body["status"] == cls.status and isinstance(body["status"], int)
    assert body["title"] == cls.title
    assert body["detail"] == "something specific" == str(problem)
    assert body["digest"] == "0102" and body["committed"] == 3


def test_detail_defaults_to_title() -> None:
    assert StaleEpoch().detail == StaleEpoch.title
    assert json.loads(StaleEpoch().render())["detail"] == StaleEpoch.title


def test_render_refuses_unserialisable_extras() -> None:
    with pytest.raises(TypeError):
        BadRequest(extra={"x": object()}).render()


def test_every_problem_is_an_exception_caught_as_sdcp_problem() -> None:
    for cls in BY_SUFFIX.values():
        with pytest.raises(SdcpProblem):
            raise cls()


# -- the client side: problem_from_response ---------------------------------------------------

from sdcp_fast.protocol.problems import UnlistedProblem, problem_from_response, type_suffix  # noqa: E402


@pytest.mark.parametrize("cls", [*PROBLEMS, BadRequest, UnknownSession, Forbidden])
@pytest.mark.parametrize("base", [PROBLEM_TYPE_BASE, "https://verifier.example/problems/", "tag:x.org,2025:",
                                  "https://example.net/types#"])
def test_any_type_uri_ending_in_a_known_suffix_is_that_problem(cls, base):
    body = {"type": base + cls.suffix, "title": "t", "status": 599, "detail": "why",
            "session_state": {"round": 3}}
    problem = problem_from_response(cls.status, body)
    assert type(problem) is cls and problem.detail == "why" and problem.extra == {"session_state": {"round": 3}}
    assert problem.status == cls.status  # the type decides, not the status member


def test_problem_round_trips_through_render():
    sent = StaleEpoch("old", extra={"session_state": {"epoch": 2}})
    got = problem_from_response(409, json.loads(sent.render()))
    assert isinstance(got, StaleEpoch) and got.to_dict() == sent.to_dict()


@pytest.mark.parametrize(("status", "body", "server"), [
    (418, {"type": "https://x/teapot", "detail": "short and stout"}, False),
    (409, {"type": "sdcp-stale-epoch-v2"}, False),  # a suffix must match whole
    (404, {"type": "about:blank"}, False),
    (503, None, True),
    (502, {"type": 7, "detail": ["not text"]}, True),
    (200, {}, True),  # no error status: treat like a failed exchange
    (True, {}, True),
    (42, {}, True),
])
def test_unknown_types_and_statuses_are_handled_by_class(status, body, server):
    problem = problem_from_response(status, body)
    assert type(problem) is UnlistedProblem and problem.server_error is server
    expected = status if type(status) is int and 100 <= status <= 599 else 500
    assert problem.status == expected and problem.suffix == f"http-{expected // 100}xx"
    rendered = json.loads(problem.render())
    assert rendered["status"] == expected and rendered["type"] == problem.type_uri
    if isinstance(body, dict) and isinstance(body.get("type"), str):
        assert problem.type_uri == body["type"]
    else:
        assert problem.type_uri == "about:blank"
    assert isinstance(problem, SdcpProblem)


def test_type_suffix_takes_the_last_segment():
    assert type_suffix(" urn:ietf:params:sdcp:problem:sdcp-limit ") == "sdcp-limit"
    assert type_suffix("https://a/b/sdcp-limit/") == "sdcp-limit"
    assert type_suffix("https://a/b#sdcp-limit") == "sdcp-limit"
    assert type_suffix("sdcp-limit") == "sdcp-limit"
