"""``--role drafter|router``: what a client can check of those roles from outside: who may
call them and how they answer a malformed body. What they send (proposals, assignments,
fences) reaches only the verifier and the store, so those statements are not reachable."""

from __future__ import annotations

import os

from sdcp_fast.conform.client import Identities, Send
from sdcp_fast.conform.report import Outcome, Report
from sdcp_fast.protocol import Action, Event, Status, instance_path_id
from sdcp_fast.protocol.messages import ROLE_DRAFTER


def _refused(status: int) -> bool | Outcome:
    """A role a certificate does not give: 403 passes, another 4xx too (refused), served is
    an interpretation (the draft names no certificate roles), anything else fails."""
    if 200 <= status < 300:
        return Outcome.INTERPRETATION
    return 400 <= status < 500


async def check_other_role(role: str, report: Report, *, as_router: Send, as_drafter: Send,
                           ids: Identities) -> None:
    report.role = role
    if role == "drafter":
        answer = await as_drafter("POST", "assignments", b"\xa0")
        report.add("drafter-router-only", _refused(answer.status), answer.brief())
        answer = await as_router("POST", "assignments", b"\xa1\x61")
        report.add("drafter-problem-details", 400 <= answer.status < 500 and answer.suffix is not None,
                   answer.brief())
        report.add("drafter-outstanding", None, "observable only at the verifier it proposes to")
        return
    other = "https://not-the-drafter.invalid/"
    status = Status(instance=other, role=ROLE_DRAFTER, load=0, queue=0, ttl_ms=1000)
    answer = await as_drafter("PUT", f"instances/{instance_path_id(other)}/status", status.encode())
    report.add("router-status-self", _refused(answer.status), answer.brief())
    event = Event(session=os.urandom(16), epoch=1, kind=Action.SWITCH, committed=0, digest=bytes(32))
    answer = await as_drafter("POST", "events", event.encode())
    report.add("router-events-role", _refused(answer.status), answer.brief())
    report.add("router-expired", None, "needs control of the deployment's instances")
    report.add("router-fence-first", None, "needs a verifier to fail and the commit log's store")
