"""§6.3 Authorization at the verifier role: "the authenticated client MUST be the drafter
named in the latest assignment the verifier received for the session; otherwise respond 403
with problem type "sdcp-not-assigned"". A certificate of another role (a router's, a
verifier's, none) is such a client too: its proposal is sdcp-not-assigned, not the role
check's sdcp-forbidden, and changes nothing."""

from __future__ import annotations

import pytest

from sdcp_fast.protocol.peer import Peer, PeerRole
from tests.roles import rolekit

DRAFTER, ROUTER, VERIFIER, Rig = rolekit.DRAFTER, rolekit.ROUTER, rolekit.VERIFIER, rolekit.Rig
problem_of, proposal, run, sid = rolekit.problem_of, rolekit.proposal, rolekit.run, rolekit.sid


@pytest.mark.parametrize("role", [PeerRole.ROUTER, PeerRole.VERIFIER, None])
def test_a_proposal_from_a_certificate_of_another_role_is_not_assigned(tmp_path, role) -> None:
    async def scenario() -> tuple[tuple[str, int], int]:
        async with Rig(str(tmp_path)) as rig:
            _, state = await rig.open(sid(1))
            stranger = rig.client(Peer(ROUTER if role is PeerRole.ROUTER else VERIFIER, role))
            try:
                await stranger.propose(VERIFIER, proposal(state, (1,), drafter=DRAFTER))
            except Exception as exc:  # noqa: BLE001 - the problem is the answer under test
                answer = problem_of(exc)
            else:
                answer = ("verified", 200)
            verdict = await rig.drafter.propose(VERIFIER, proposal(state, (1,)))
            return answer, verdict.round

    answer, next_round = run(scenario())
    assert answer == ("sdcp-not-assigned", 403)
    assert next_round == 1  # the refused proposal used no round
