"""``sdcp-fast conform URL``: a black-box client that checks an SDCP verifier against the draft.

It speaks only the draft's messages, with two identities from the deployment's CA: a
**router** (it opens sessions, names the drafter, re-opens at a new epoch, §6.1, §6.9) and a
**drafter** (it proposes, §6.2). It knows nothing of the target model, and learns what it
needs from the verifier itself: a first rule-1 session commits greedy decoding whatever is
proposed (§6.4), so its output is the greedy continuation of the kit's prompt, and every later
rule-1 verdict on that prompt is predicted exactly (accepted, emitted, n, d[n]), as is every
ladder action, low counter and reduced m_cap (§6.5.2, :mod:`sdcp_fast.conform.ladder`).

What the draft leaves to the deployment (the cache serving q rows and committed tokens, the
commit log's store) comes from a :mod:`~sdcp_fast.conform.adapters` store; without one those
checks are *not reachable*. Each check records its outcome in a
:class:`~sdcp_fast.conform.report.Report` under its id in
:data:`~sdcp_fast.conform.statements.CHECKS`.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

from sdcp_fast.conform.adapters import NamesOnly
from sdcp_fast.conform.client import Answer, Identities, Send
from sdcp_fast.conform.report import Outcome, Report
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
GROUPS = ("transport", "auth", "contracts", "session", "rule1", "refusals", "ladder", "rule2", "recovery")


class ConformError(Exception):
    """The run cannot go on (no session could be opened, ...)."""


class Conform:
    """The checks. ``as_router`` / ``as_drafter`` send ``(method, path, body, query)`` with that
    identity and return an :class:`Answer`; ``stranger`` (optional) sends without a client
    certificate; ``store`` reaches the deployment's cache and commit log (adapters.py);
    ``probe`` (optional) runs the transport checks that need sockets of their own (§5.1);
    ``oracle`` (optional) gives the target's logits (oracles.py); ``session_ids`` (optional)
    draws the session ids (by default from the operating system)."""

    def __init__(self, target: str, *, as_router: Send, as_drafter: Send, ids: Identities,
                 target_digest: bytes | None, vocab: int | None = None, store: Any = None,
                 scope: bytes | None = None, stranger: Send | None = None, vectors: str | None = None,
                 probe: Any = None, oracle: Any = None, session_ids: Any = None) -> None:
        from sdcp_fast.conform.checks_contracts import default_vectors

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
        self._greedy: list[int] | None = None

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

    # -- what the kit learns ------------------------------------------------------------------

    async def greedy(self) -> list[int]:
        """The greedy continuation of PROMPT, from a rule-1 session whatever it proposes (§6.4)."""
        if self._greedy is None:
            from sdcp_fast.conform.driver import Scripted

            s = await Scripted(self, self.contract(max_new=GREEDY_LENGTH), None).open()
            while len(s.committed) < GREEDY_LENGTH:
                v = await s.round((s.committed[-1] if s.committed else 1,))
                if v is None:
                    raise ConformError("a rule-1 proposal on the committed prefix was refused")
                if v.action in (Action.FINISH, Action.FAIL) and len(s.committed) < GREEDY_LENGTH:
                    raise ConformError(f"the session ended after {len(s.committed)} of {GREEDY_LENGTH} tokens")
            self._greedy = s.committed[:GREEDY_LENGTH]
        return self._greedy

    # -- the run ------------------------------------------------------------------------------

    async def run(self, groups: tuple[str, ...] = GROUPS) -> Report:
        from sdcp_fast.conform import (
            checks_contracts,
            checks_ladder,
            checks_recovery,
            checks_rounds,
            checks_rule2,
        )

        r = self.report
        steps = {
            "transport": checks_contracts.transport, "auth": checks_contracts.authentication,
            "contracts": checks_contracts.contracts, "session": checks_rounds.session_creation,
            "rule1": checks_rounds.rule1, "refusals": checks_rounds.refusals, "ladder": checks_ladder.ladder,
            "rule2": checks_rule2.rule2, "recovery": checks_recovery.recovery,
        }
        for group in groups:
            needs_session = group not in ("transport", "auth", "contracts")
            if needs_session and self.target_digest is None:
                r.add("open-state", None, "give --target-digest: every check that needs a session")
                continue
            try:
                await steps[group](self)
            except ConformError as exc:
                # One group's trouble does not hide the others: each opens sessions of its own.
                r.add("open-state", Outcome.FAIL, f"{group}: the checks could not go on: {exc}")
        return r


__all__ = ["Answer", "Conform", "ConformError", "GROUPS", "Identities", "PROMPT"]
