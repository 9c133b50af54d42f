"""The verifier reads a round's q rows in place from the drafter's session slot in the MLC
node's shared memory (sdcp_fast/store/shm_client.py, sdcp_fast/roles/verifier_batch.py
``_fetch_q`` and ``enqueue_in_place``), and checks after the kernels read them that the
writer did not rewrite them: rows that changed meanwhile are sdcp-q-unavailable, never a
verdict from mixed bytes."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from sdcp_fast.cache import object_uri
from sdcp_fast.cache.tiers.shm import name_digest
from sdcp_fast.cache.uri import writer_tag
from sdcp_fast.protocol.messages import RULE_SPECULATIVE
from sdcp_fast.roles.verifier import VerifierRole
from sdcp_fast.roles.wire import SdcpClient
from sdcp_fast.store import RemoteStore, shm_client
from sdcp_fast.transport.inprocess import InProcessNetwork
from tests.roles.rolekit import (
    DRAFTER,
    DRAFTER_PEER,
    ROUTER_PEER,
    SCOPE,
    VERIFIER,
    VERIFIER_PEER,
    AnsweredNow,
    CountingScorer,
    assignment,
    contract,
    problem_of,
    proposal,
    session_open,
    sid,
    verifier_config,
)
from tests.store.test_shm_client import node

TAG = writer_tag(DRAFTER)


def rows_uri(session: bytes, round_: int) -> str:
    return object_uri(SCOPE, session, "q_rows", round_, tag=TAG)


@contextlib.asynccontextmanager
async def rule2_session(base: str, *, direct: bool = False) -> AsyncIterator[Any]:
    """A verifier over this node (``direct``: its handler as the native server calls it), a
    rule-2 session opened and assigned to DRAFTER, and a drafter-like writer rolling one slot
    per session."""
    network = InProcessNetwork()
    scorer = CountingScorer()
    reader, writer = RemoteStore(base), RemoteStore(base)
    assert writer.shm is not None
    writer.shm.rolling = True
    verifier = VerifierRole(scorer, verifier_config(), mlc=reader, transport=network.transport(VERIFIER_PEER))
    handler = AnsweredNow(verifier.routes)
    network.register(VERIFIER, handler if direct else verifier.handler)
    router, drafter = SdcpClient(network.transport(ROUTER_PEER)), SdcpClient(network.transport(DRAFTER_PEER))
    await verifier.start()
    try:
        session = sid(7)
        opened = session_open(session, contract(RULE_SPECULATIVE))
        state: Any = await router.open_session(VERIFIER, opened)
        state = await router.put_drafter(VERIFIER, assignment(opened, state, drafter=DRAFTER, m_init=4))
        yield SimpleNamespace(session=session, state=state, scorer=scorer, vocab=scorer.vocab_size, writer=writer,
                              verifier=verifier, drafter=drafter, handler=handler)
    finally:
        await verifier.close()
        await reader.aclose()
        await writer.aclose()


async def scenario(base: str, rewrite_during_pass: bool | str) -> Any:
    """One rule-2 round whose rows a drafter-like writer put in its session slot; with
    ``rewrite_during_pass`` the writer rewrites the slot (its next round) while the pass runs.
    The verdict, or the problem's type; and the verifier's output."""
    async with rule2_session(base) as r:
        session, vocab = r.session, r.vocab
        rows = torch.full((2, vocab), 1.0 / vocab)
        await r.writer.put(rows_uri(session, 1), memoryview(rows.numpy()).cast("B"), 30.0)
        roll = next(iter(r.writer.shm._rolls.values()))

        def rewrite(_: Any) -> None:
            if rewrite_during_pass:  # the writer moves on while the kernels read round 1
                other = torch.linspace(1.0, 2.0, vocab).repeat(2, 1)
                if rewrite_during_pass == "zeros":  # rows the kernel itself flags: q(x) = 0 at the proposal
                    other[:, 4:6] = 0.0
                other /= other.sum(dim=1, keepdim=True)
                roll.write(memoryview(other.numpy()).cast("B"), 2, name_digest(rows_uri(session, 2)))

        r.scorer.on_score = rewrite
        try:
            out: Any = await r.drafter.propose(VERIFIER, proposal(r.state, [4, 5], q_rows=rows_uri(session, 1)))
        except Exception as exc:
            out = problem_of(exc)[0]
        return out, list(r.verifier.sessions.get(session).output(0).tokens)


@pytest.mark.parametrize("rewritten", [False, True, "zeros"], ids=["held", "rewritten", "rewritten-flagged"])
def test_rows_rewritten_while_the_kernels_read_them_are_q_unavailable(tmp_path, monkeypatch, rewritten):
    monkeypatch.setattr(shm_client, "MIN_BYTES", 1)  # the toy's rows are small
    with node(tmp_path) as (_, base):
        out, output = asyncio.run(scenario(base, rewritten))
    if rewritten:
        assert out == "sdcp-q-unavailable" and output == []  # nothing committed
    else:
        assert out.committed == len(out.emitted) > 0 and output == list(out.emitted)


async def rounds_answered_now(base: str, rewrite_round: int, zero_round: int = 0) -> Any:
    """Three rule-2 rounds whose rows a drafter-like writer put in its session slot, the
    writer rewriting the slot while round ``rewrite_round``'s pass runs; round
    ``zero_round``'s rows give its first token q = 0. Each round's verdict (or problem type),
    whether each proposal took a task, and the verifier's output."""
    async with rule2_session(base, direct=True) as r:
        session, vocab, state = r.session, r.vocab, r.state
        rows = torch.full((2, vocab), 1.0 / vocab)
        outs: list[Any] = []
        for n in (1, 2, 3):
            sent = rows.clone()
            if n == zero_round:
                sent[0, 4] = 0.0
            await r.writer.put(rows_uri(session, n), memoryview(sent.numpy()).cast("B"), 30.0)
            roll = next(iter(r.writer.shm._rolls.values()))

            def rewrite(_: Any, n: int = n, roll: Any = roll) -> None:
                if n == rewrite_round:
                    other = torch.linspace(1.0, 2.0, vocab).repeat(2, 1)
                    other /= other.sum(dim=1, keepdim=True)
                    roll.write(memoryview(other.numpy()).cast("B"), n + 1, name_digest(rows_uri(session, n + 1)))

            r.scorer.on_score = rewrite
            try:
                out: Any = await r.drafter.propose(VERIFIER, proposal(state, [4, 5], q_rows=rows_uri(session, n)))
                state = out
            except Exception as exc:
                out = problem_of(exc)[0]
            outs.append(out)
        return outs, r.handler.tasks, list(r.verifier.sessions.get(session).output(0).tokens)


def test_rows_in_a_known_slot_are_answered_without_a_task_and_still_checked(tmp_path, monkeypatch):
    """Once the node's folder is known (the first round's read asks it), a rule-2 round whose
    rows the slot holds is answered in a plain call with a future, as a rule-1 round is; its
    rows are still checked after the kernels: rewritten meanwhile, sdcp-q-unavailable."""
    monkeypatch.setattr(shm_client, "MIN_BYTES", 1)
    with node(tmp_path) as (_, base):
        outs, tasks, output = asyncio.run(rounds_answered_now(base, rewrite_round=3))
    assert tasks == [True, False, False]
    first, second, third = outs
    assert third == "sdcp-q-unavailable"
    assert second.committed == len(first.emitted) + len(second.emitted)
    assert output == [*first.emitted, *second.emitted]


def test_a_zero_q_read_in_place_is_the_same_problem_as_read_by_the_task(tmp_path, monkeypatch):
    """Rows read in place are checked by the core as fetched ones are: a proposed token with
    q = 0 is sdcp-bad-proposal and commits nothing."""
    monkeypatch.setattr(shm_client, "MIN_BYTES", 1)
    with node(tmp_path) as (_, base):
        outs, tasks, output = asyncio.run(rounds_answered_now(base, rewrite_round=0, zero_round=3))
    assert tasks == [True, False, False]
    assert outs[2] == "sdcp-bad-proposal"
    assert output == [*outs[0].emitted, *outs[1].emitted]
