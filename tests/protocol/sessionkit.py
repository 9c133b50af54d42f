"""Builders for verifier-session tests: a contract, an opened and assigned session, proposals,
and a round driven to its end. Shared by tests/protocol and tests/spec (§6)."""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from sdcp_fast.protocol.messages import (
    Assignment,
    Contract,
    Proposal,
    Sampling,
    SessionOpen,
    Status,
)
from sdcp_fast.protocol.session import RoundDone, ScoreNeeded, VerifierSession
from sdcp_fast.protocol.status_table import StatusTable

TARGET = bytes(range(32))
TOKENIZER = bytes(32)
SID = b"S" * 16
DRAFTER = "https://drafter-a.example/"
VERIFIER = "https://verifier.example/"
PROMPT = (11, 12, 13)
STATUS = Status(instance=DRAFTER, role=1, load=10, queue=0, ttl_ms=1000)


def contract(**overrides: Any) -> Contract:
    fields: dict[str, Any] = dict(
        target=TARGET, tokenizer=TOKENIZER, rule=1, m_max=8, max_new=100, stop=(2,), low_rounds=2,
        fallback=(1, 2, 5),
    )
    fields.update(overrides)
    return Contract(**fields)


def open_session(c: Contract | None = None, *, epoch: int = 1, m_init: int = 4,
                 drafter: str | None = DRAFTER) -> VerifierSession:
    c = c or contract()
    session, _ = VerifierSession.open(
        SessionOpen(session=SID, epoch=epoch, contract=c, prompt=PROMPT, commit_log="mlc://log"),
        target_digest=TARGET,
    )
    if drafter is not None:
        session.assign(assignment(session, drafter=drafter, m_init=m_init))
    return session


def assignment(session: VerifierSession, *, drafter: str = DRAFTER, m_init: int = 4,
               sampling: Sampling | None = None) -> Assignment:
    return Assignment(
        session=session.session, epoch=session.epoch, contract=session.contract, verifier=VERIFIER,
        drafter=drafter, prompt=PROMPT, round=session.round, committed=session.committed,
        digest=session.digest, m_init=m_init, sampling=sampling,
    )


def proposal(session: VerifierSession, tokens: Sequence[int], **overrides: Any) -> Proposal:
    p = Proposal(
        session=session.session, epoch=session.epoch, round=session.round + 1, drafter=DRAFTER,
        base=session.committed, base_digest=session.digest, tokens=tuple(tokens), status=STATUS,
        q_rows="mlc://q" if session.contract.rule == 2 else None,
    )
    return replace(p, **overrides)


def q_bytes(rows: Sequence[Sequence[float]]) -> bytes:
    return b"".join(struct.pack(f"<{len(r)}f", *r) for r in rows)


def run_round(session: VerifierSession, tokens: Sequence[int], accepted: int, next_token: int, *,
              load: int = 0, client: str = DRAFTER, now: float = 0.0) -> RoundDone:
    """One rule-1 (or rule-2 with q = 1/2 everywhere) round to its commit."""
    work = session.receive_proposal(proposal(session, tokens, drafter=client), client=client, now=now)
    assert isinstance(work, ScoreNeeded)
    if work.needs_q:
        session.provide_q([0.5] * len(tokens))
    session.complete_scoring(accepted, next_token, load=load)
    done = session.append_done(ok=True)
    assert isinstance(done, RoundDone)
    return done


MODEL_A, MODEL_B = b"A" * 32, b"B" * 32


def status(name: str, load: int = 10, queue: int = 0, accept: int | None = None, ttl_ms: int = 1000,
           role: int = 1) -> Status:
    return Status(instance=name, role=role, load=load, queue=queue, ttl_ms=ttl_ms, accept_milli=accept)


def table_with(*statuses: Status, now: float = 0.0, models: dict[str, bytes] | None = None) -> StatusTable:
    """A router's status table holding ``statuses`` (reported at ``now``), each with a model."""
    table = StatusTable()
    for s in statuses:
        table.report(s, now)
        table.register_model(s.instance, (models or {}).get(s.instance, MODEL_A))
    return table
