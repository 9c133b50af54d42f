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
