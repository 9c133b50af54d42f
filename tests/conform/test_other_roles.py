"""``--role drafter|router`` on small fakes: a role that refuses what a drafter certificate
may not do passes; one that answers everything with a 500 fails every reachable check."""

from __future__ import annotations

import asyncio
import json

import pytest

from sdcp_fast.conform.client import Answer
from sdcp_fast.conform.other_roles import check_other_role
from sdcp_fast.conform.report import Outcome, Report
from sdcp_fast.conform.statements import OTHER_ROLES

from .harness import IDS


def _fake(status: int):  # type: ignore[no-untyped-def]
    async def send(method: str, path: str, body: bytes = b"", query: object = None) -> Answer:
        problem = {"type": "urn:ietf:params:sdcp:problem:sdcp-x", "status": status}
        return Answer(status, json.dumps(problem).encode(), "application/problem+json")
    return send


@pytest.mark.parametrize("role", ["drafter", "router"])
@pytest.mark.parametrize(("status", "expected"), [(403, Outcome.PASS), (500, Outcome.FAIL)])
def test_other_roles(role: str, status: int, expected: Outcome) -> None:
    report = Report("https://x/", role)
    asyncio.run(check_other_role(role, report, as_router=_fake(status if status == 500 else 400),
                                 as_drafter=_fake(status), ids=IDS))
    reached = [f for f in report.findings if f.outcome is not Outcome.UNREACHABLE]
    assert reached and all(f.outcome is expected for f in reached), report.text()
    assert {f.check for f in report.findings} <= OTHER_ROLES
