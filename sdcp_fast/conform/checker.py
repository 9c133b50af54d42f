"""What every check of the kit works with: the verifier under test reached as **router** and
as **drafter**, the draft's messages built from the kit's defaults, the store of what the draft
leaves to the deployment, and the report the outcomes go into. The checks (``checks_*.py``) and
the sequence driver (driver.py) take a :class:`Checker`; kit.py runs them in their groups.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

from sdcp_fast.conform.adapters import NamesOnly
from sdcp_fast.conform.client import Answer, Identities, Send
from sdcp_fast.conform.report import Report
from sdcp_fast.protocol import (
    Action,
    Assignment,
    Contract,
    Output,
    Proposal,
    Sampling,
    SessionOpen,
    SessionState,
    Status,
    Verdict,
    session_path_id,
)
from sdcp_fast.protocol.messages import MEDIA_TYPE, ROLE_DRAFTER, RULE_GREEDY, RULE_SPECULATIVE

PROMPT = (1, 2, 3)
GREEDY_LENGTH = 48  # tokens of greedy continuation learned first; every scripted session stays within it


class ConformError(Exception):
    """The run cannot go on (no session could be opened, ...)."""


class Checker:
    """What every check works with. ``as_router`` / ``as_drafter`` send ``(method, path, body, query)`` with that
    identity and return an :class:`Answer`; ``stranger`` (optional) sends without a client
    certificate; ``store`` reaches the deployment's cache and commit log (adapters.py);
    ``probe`` (optional) runs the transport checks that need sockets of their own (§5.1);
    ``oracle`` (optional) gives the target's logits (oracles.py); ``session_ids`` (optional)
    draws the session ids (by default from the operating system)."""

    def __init__(self, target: str, *, as_router: Send, as_drafter: Send, ids: Identities,
                 target_digest: bytes | None, vocab: int | None = None, store: Any = None,
                 scope: bytes | None = None, stranger: Send | None = None, vectors: str | None = None,
                 probe: Any = None, oracle: Any = None, session_ids: Any = None) -> None:
        self.target = target
        self._as_router = as_router
        self._as_drafter = as_drafter
        self.stranger = stranger
        self.ids = ids
        self.target_digest = target_digest
        self.vocab = vocab
        self.store = store if store is not None else NamesOnly()
        self.can_put = not isinstance(self.store, NamesOnly)
        self.scope = scope or os.urandom(16)
        self.vectors = vectors if vectors is not None else default_vectors()
        self.probe = probe
        self.oracle = oracle  # the target's logits (oracles.py), for rule 2 above temperature 0
        self._ids = session_ids or (lambda: os.urandom(16))
        self.report = Report(target, "verifier")
        describe = getattr(self.store, "describe", None)
        self.report.notes.append(describe() if describe is not None else f"store: {type(self.store).__name__}")
        if oracle is not None:
            self.report.notes.append(f"target logits from {type(oracle).__name__} (the oracle must serve the "
                                     "verifier's model)")
        self.greedy: list[int] | None = None  # learned once (driver.learn_greedy), shared by the checks

    # -- sending ----------------------------------------------------------------------------

    def _media(self, answer: Answer, what: str) -> Answer:
        if answer.status == 200:
            self.report.add("media-type", answer.content_type.split(";")[0].strip() == MEDIA_TYPE,
                            f"{what}: {answer.content_type!r}")
        return answer

    async def as_router(self, method: str, path: str, body: bytes = b"", query: Any = None) -> Answer:
        return self._media(await self._as_router(method, path, body, query), f"{method} {path}")

    async def as_drafter(self, method: str, path: str, body: bytes = b"", query: Any = None) -> Answer:
        return self._media(await self._as_drafter(method, path, body, query), f"{method} {path}")

    # -- messages ---------------------------------------------------------------------------

    def contract(self, rule: int = RULE_GREEDY, **kw: Any) -> Contract:
        fields: dict[str, Any] = dict(
            target=self.target_digest or bytes(32), tokenizer=hashlib.sha256(b"sdcp-conform").digest(), rule=rule,
            m_max=4, max_new=12, stop=(), low_rounds=1_000_000, fallback=(int(Action.FAIL),), scope=self.scope,
            sampling=Sampling(temperature_milli=0, seed=7) if rule == RULE_SPECULATIVE else None)
        fields.update(kw)
        return Contract(**fields)

    def session_open(self, c: Contract, session: bytes | None = None, prompt: tuple[int, ...] = PROMPT,
                     epoch: int = 1, **kw: Any) -> SessionOpen:
        session = session or self._ids()
        return SessionOpen(session=session, epoch=epoch, contract=c, prompt=prompt,
                           commit_log=self.store.commit_log(self.scope, session), **kw)

    async def post_session(self, opened: SessionOpen) -> Answer:
        return await self.as_router("POST", "sessions", opened.encode())

    async def open(self, c: Contract, prompt: tuple[int, ...] = PROMPT, *, assign: bool = True,
                   m_init: int | None = None) -> tuple[SessionOpen, SessionState]:
        opened = self.session_open(c, prompt=prompt)
        answer = await self.post_session(opened)
        if answer.status != 200:
            raise ConformError(f"POST sessions answered {answer.status} {answer.body[:200]!r}")
        state = SessionState.decode(answer.body)
        if assign:
            state = await self.assign(opened, state, m_init=m_init)
        return opened, state

    def assignment(self, opened: SessionOpen, state: SessionState | Verdict, drafter: str | None = None,
                   epoch: int | None = None, m_init: int | None = None) -> Assignment:
        return Assignment(session=opened.session, epoch=opened.epoch if epoch is None else epoch,
                          contract=opened.contract, verifier=self.target,
                          drafter=drafter or self.ids.drafter.uri or "", prompt=opened.prompt, round=state.round,
                          committed=state.committed, digest=state.digest,
                          m_init=m_init or opened.contract.m_max)

    async def put_drafter(self, opened: SessionOpen, a: Assignment) -> Answer:
        return await self.as_router("PUT", f"sessions/{session_path_id(opened.session)}/drafter", a.encode())

    async def assign(self, opened: SessionOpen, state: SessionState | Verdict, drafter: str | None = None,
                     m_init: int | None = None) -> SessionState:
        answer = await self.put_drafter(opened, self.assignment(opened, state, drafter, m_init=m_init))
        if answer.status != 200:
            raise ConformError(f"PUT sessions/{{id}}/drafter answered {answer.status} {answer.body[:200]!r}")
        return SessionState.decode(answer.body)

    def proposal(self, state: SessionState | Verdict, tokens: tuple[int, ...], **kw: Any) -> Proposal:
        status = Status(instance=self.ids.drafter.uri or "", role=ROLE_DRAFTER, load=0, queue=0, ttl_ms=10_000)
        fields: dict[str, Any] = dict(session=state.session, epoch=state.epoch, round=state.round + 1,
                                      drafter=self.ids.drafter.uri or "", base=state.committed,
                                      base_digest=state.digest, tokens=tokens, status=status)
        fields.update(kw)
        return Proposal(**fields)

    async def propose(self, p: Proposal | bytes) -> Answer:
        return await self.as_drafter("POST", "proposals", p if isinstance(p, bytes) else p.encode())

    async def output(self, session: bytes, start: int) -> Answer:
        return await self.as_router("GET", f"sessions/{session_path_id(session)}/output", b"", {"from": str(start)})

    async def output_tokens(self, session: bytes, start: int = 0) -> Output | None:
        answer = await self.output(session, start)
        return Output.decode(answer.body) if answer.status == 200 else None

    def refused(self, check: str, answer: Answer, status: int, suffix: str | None, note: str = "") -> bool:
        """Record ``check``: ``answer`` must be ``status`` with problem type ``suffix``."""
        ok = answer.status == status and (suffix is None or answer.suffix == suffix)
        return self.report.add(check, ok, (note + ": " if note else "") + answer.brief())


def default_vectors() -> str | None:
    """tests/vectors of a source checkout of sdcp_fast, when the kit runs from one."""
    here = os.path.dirname(os.path.abspath(__file__))
    candidate = os.path.normpath(os.path.join(here, "..", "..", "tests", "vectors"))
    return candidate if os.path.isfile(os.path.join(candidate, "contracts.json")) else None
