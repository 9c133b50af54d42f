"""Ended sessions give back what they hold (roles/verifier_state.retire_ended): their KV pages
at once, their record after a while or beyond a count, so a long-running verifier's table
stays the size of its open sessions."""

from __future__ import annotations

import pytest

from sdcp_fast.protocol import SdcpProblem
from sdcp_fast.roles.verifier_state import retire_ended

from .rolekit import VERIFIER, Rig, contract, proposal, run, sid

S, T, U = sid(1), sid(2), sid(3)


async def _finish(rig: Rig, session: bytes) -> None:
    _, state = await rig.open(session, contract(max_new=3), m_init=2)
    verdict = await rig.drafter.propose(VERIFIER, proposal(state, rig.greedy_after(state, 2)))
    assert verdict.committed == 3


def test_ended_sessions_release_their_pages_then_are_forgotten(tmp_path):
    async def scenario():
        async with Rig(str(tmp_path)) as rig:
            await _finish(rig, S)
            await rig.open(U, contract(max_new=50), m_init=2)  # open: never touched
            released: list[bytes] = []
            table = rig.verifier.sessions
            assert retire_ended(table, released.append, 100.0, keep=60.0) == 0
            assert released == [S] and S in table and U in table
            out = await rig.router.output(VERIFIER, S, 0)  # still answers its output
            assert out.final and len(out.tokens) == 3
            assert retire_ended(table, released.append, 130.0, keep=60.0) == 0
            assert released == [S]  # pages given back once
            assert retire_ended(table, released.append, 160.0, keep=60.0) == 1
            assert S not in table and U in table
            with pytest.raises(SdcpProblem) as exc:
                await rig.router.output(VERIFIER, S, 0)
            assert exc.value.status == 404

    run(scenario())


def test_beyond_the_count_the_oldest_ended_session_goes_first(tmp_path):
    async def scenario():
        async with Rig(str(tmp_path)) as rig:
            table = rig.verifier.sessions
            await _finish(rig, S)
            retire_ended(table, lambda s: None, 10.0, most=1)
            await _finish(rig, T)
            assert retire_ended(table, lambda s: None, 11.0, most=1) == 1
            assert S not in table and T in table

    run(scenario())
