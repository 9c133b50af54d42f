"""The drafter's side of SDCP (draft §6.2): choosing M, estimating acceptance, and the
per-session record that keeps one proposal outstanding and follows the verifier's
verdicts. Pure: the model, the cache and the network are the adapter's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from sdcp_fast.protocol.digests import extend_digest
from sdcp_fast.protocol.messages import Action, Assignment, Proposal, SessionState, Status, Verdict
from sdcp_fast.protocol.problems import (
    BadProposal,
    BadRequest,
    Limit,
    QUnavailable,
    SdcpProblem,
    StaleBase,
)


def expected_tokens(alpha: float, m: int) -> float:
    """Expected tokens committed by a round of M proposals at per-token acceptance alpha:
    (1 - alpha^(M+1)) / (1 - alpha), and M + 1 at alpha = 1 [LEVIATHAN]."""
    if alpha >= 1.0:
        return float(m + 1)
    alpha = max(0.0, alpha)
    return (1.0 - alpha ** (m + 1)) / (1.0 - alpha)


def choose_m(alpha: float, t_d: float, t_v: float, limit: int) -> int:
    """The RECOMMENDED M of §6.2: within 1..limit, maximize expected_tokens / (M t_d + t_v).

    ``limit`` is min(m_max, m_cap). Ties go to the smaller M (less draft work for the same
    throughput). With no cost at all (t_d = t_v = 0), the limit.
    """
    if limit < 1:
        raise ValueError("limit must be at least 1")
    best_m, best = 1, -1.0
    for m in range(1, limit + 1):
        cost = m * t_d + t_v
        if cost <= 0.0:
            return limit
        rate = expected_tokens(alpha, m) / cost
        if rate > best:
            best_m, best = m, rate
    return best_m


class AcceptanceEstimator:
    """EWMA of the per-token acceptance probability alpha, and of a/M for status reports.

    A round with a < M is a accepted trials and one rejection; a fully accepted round is M
    accepted trials and no rejection. Decayed sums of both give alpha = accepted / trials,
    which, unlike the mean of a/M, is not biased low by the stop at the first rejection.
    """

    def __init__(self, decay: float = 0.8, prior: float = 0.5, prior_weight: float = 1.0) -> None:
        if not 0.0 <= decay < 1.0:
            raise ValueError("decay must be in [0, 1)")
        self.decay = decay
        self._accepted = prior * prior_weight
        self._trials = prior_weight
        self._ratio = prior
        self._accept_milli = self._milli()

    def update(self, accepted: int, proposed: int) -> None:
        if proposed < 1 or not 0 <= accepted <= proposed:
            raise ValueError("need 0 <= accepted <= proposed, proposed >= 1")
        d = self.decay
        self._accepted = d * self._accepted + accepted
        self._trials = d * self._trials + accepted + (1 if accepted < proposed else 0)
        self._ratio = d * self._ratio + (1.0 - d) * accepted / proposed
        self._accept_milli = self._milli()

    def _milli(self) -> int:
        return max(0, min(1000, round(self._ratio * 1000)))

    @property
    def alpha(self) -> float:
        return self._accepted / self._trials if self._trials > 0 else 0.0

    @property
    def accept_milli(self) -> int:
        """For the status member accept_milli: EWMA of a/M x 1000 (§5.2); worked out once per
        update, as every proposal's status reads it."""
        return self._accept_milli


@dataclass(frozen=True, slots=True)  # one a verdict: slots build it in about half the time
class VerdictOutcome:
    """What a verdict means for the drafter: go on (``proceed``), and whether a proposal
    prepared on the assumption of full acceptance may now be sent (``speculation_ok``)."""

    proceed: bool
    full: bool
    speculation_ok: bool


def state_from_problem(problem: SdcpProblem) -> SessionState | None:
    """The session-state a 409 problem carries in its ``session_state`` member, if any.

    The member is the session-state map; rendered as JSON its byte strings are hex
    (problems.py), so both hex text and bytes are read.
    """
    raw: Any = problem.extra.get("session_state")
    if isinstance(raw, SessionState):
        return raw
    if not isinstance(raw, dict):
        return None
    try:
        fields = {k: bytes.fromhex(v) if k in ("session", "digest") and isinstance(v, str) else v
                  for k, v in raw.items()}
        return SessionState.from_map(fields)
    except (BadRequest, ValueError):
        return None


def _check_verdict(verdict: Verdict, sent: Proposal, m_max: int) -> None:
    """:class:`BadRequest` unless ``verdict`` can answer ``sent`` (§5.2, §6.3): checked before
    the drafter adopts anything of it, so a malformed verdict changes nothing.

    A verdict that is a genuine record of the round on the proposal's base (its emitted tokens
    chain from base_digest to its digest) but does not answer this proposal (a > M, or other
    tokens) was verified for another request: the verifier returns a round's recorded verdict
    to any request naming it (§6.3), e.g. to a drafter assigned while the round was in flight.
    Its problem carries that ``session_state``, so :meth:`DrafterSession.on_problem` can
    resynchronize as after a stale base.
    """
    emitted = verdict.emitted
    if verdict.epoch != sent.epoch:
        raise BadRequest(f"verdict epoch {verdict.epoch}, proposal epoch {sent.epoch}")
    if not 1 <= len(emitted) <= verdict.accepted + 1:
        raise BadRequest(f"verdict emits {len(emitted)} tokens after accepting {verdict.accepted}")
    if len(emitted) <= verdict.accepted and Action.parse(int(verdict.action)) is not Action.FINISH:
        # Only a stop token or max_new truncates the emitted tokens (§6.3), and both finish.
        raise BadRequest("verdict's emitted tokens are truncated but the session goes on")
    if verdict.committed != sent.base + len(emitted):
        raise BadRequest(f"verdict committed {verdict.committed}, expected {sent.base + len(emitted)}")
    if verdict.m_cap > m_max:
        raise BadRequest(f"verdict m_cap {verdict.m_cap} exceeds m_max {m_max}")
    if extend_digest(sent.base_digest, emitted) != verdict.digest:
        raise BadRequest("verdict digest is not d[committed] of its emitted tokens")
    m = len(sent.tokens)
    kept = min(len(emitted), verdict.accepted)
    if verdict.accepted > m or emitted[:kept] != sent.tokens[:kept]:
        state = SessionState(session=verdict.session, epoch=verdict.epoch, round=verdict.round,
                             committed=verdict.committed, digest=verdict.digest)
        raise BadRequest(f"verdict accepts {verdict.accepted} tokens {emitted[:kept]} of another request, "
                         f"not of the {m} proposed", extra={"session_state": state.to_map()})


class DrafterError(Exception):
    """Misuse of the drafter record by its adapter (a local bug, never sent on the wire)."""


class DrafterSession:
    """One assigned session at a drafter: base/round bookkeeping and the one-outstanding rule."""

    def __init__(self, assignment: Assignment, *, estimator: AcceptanceEstimator | None = None) -> None:
        self.assignment = assignment
        self.session = assignment.session
        self.epoch = assignment.epoch
        self.round = assignment.round  # last round with a verdict
        self.committed = assignment.committed
        self.digest = assignment.digest
        self.limit = 1  # min(m_max, m_cap) for the next proposal (§6.2), kept with m_cap
        self.m_cap = assignment.m_init
        self.estimator = estimator or AcceptanceEstimator()
        self.outstanding: Proposal | None = None
        self.stopped: Action | None = None  # set once told to stop (switch, self_decode, end)

    @property
    def m_cap(self) -> int:
        return self._m_cap

    @m_cap.setter
    def m_cap(self, value: int) -> None:
        self._m_cap = value
        self.limit = max(1, min(self.assignment.contract.m_max, value))

    def choose_m(self, t_d: float, t_v: float) -> int:
        return choose_m(self.estimator.alpha, t_d, t_v, self.limit)

    def propose(
        self,
        tokens: Sequence[int],
        status: Status,
        *,
        q_rows: str | None = None,
        draft_kv: str | None = None,
    ) -> Proposal:
        """The proposal for the next round, on the base last learned from the verifier."""
        if self.stopped is not None:
            raise DrafterError(f"told to stop proposing ({self.stopped.name.lower()})")
        if self.outstanding is not None:
            raise DrafterError("a proposal is outstanding for this session (§6.2)")
        if not 1 <= len(tokens) <= self.limit:
            raise DrafterError(f"M = {len(tokens)} outside 1..{self.limit}")
        self.outstanding = Proposal(
            session=self.session, epoch=self.epoch, round=self.round + 1,
            drafter=self.assignment.drafter, base=self.committed, base_digest=self.digest,
            tokens=tuple(tokens), status=status, q_rows=q_rows, draft_kv=draft_kv,
        )
        return self.outstanding

    def retry(self, status: Status | None = None) -> Proposal:
        """The outstanding proposal again, for a verdict that was lost (§6.9)."""
        if self.outstanding is None:
            raise DrafterError("no proposal outstanding")
        if status is not None:
            self.outstanding = replace(self.outstanding, status=status)
        return self.outstanding

    def on_verdict(self, verdict: Verdict, *, assumed: Sequence[int] | None = None) -> VerdictOutcome:
        """Follow a verdict for the outstanding proposal. A verdict that cannot answer it
        (accepted > M, emitted tokens or length inconsistent, digest not the chain's, m_cap
        above m_max) is :class:`BadRequest` and changes nothing.

        ``assumed`` is what a speculatively prepared next proposal took as this round's
        emitted tokens (all M proposed plus the drafter's guess of the extra token); it
        may be sent only if the verdict emitted exactly that.
        """
        sent = self.outstanding
        if sent is None or verdict.round != sent.round or verdict.session != self.session:
            raise DrafterError(f"verdict for round {verdict.round} matches no outstanding proposal")
        _check_verdict(verdict, sent, self.assignment.contract.m_max)
        self.outstanding = None
        self.round = verdict.round
        self.committed = verdict.committed
        self.digest = verdict.digest
        self.m_cap = verdict.m_cap
        self.estimator.update(verdict.accepted, len(sent.tokens))
        action = Action.parse(int(verdict.action))
        if action not in (Action.CONTINUE, Action.REDUCE):
            self.stopped = action
        full = verdict.accepted == len(sent.tokens)
        proceed = self.stopped is None
        speculation_ok = (proceed and full and assumed is not None
                          and tuple(assumed) == verdict.emitted)
        return VerdictOutcome(proceed=proceed, full=full, speculation_ok=speculation_ok)

    def resync(self, state: SessionState) -> None:
        """Adopt the verifier's session-state from a stale-base problem (§6.3)."""
        if state.session != self.session:
            raise DrafterError("session-state for another session")
        self.outstanding = None
        self.round = state.round
        self.committed = state.committed
        self.digest = state.digest

    def on_problem(self, problem: SdcpProblem) -> bool:
        """Follow a problem answering the outstanding proposal; True if drafting may go on.

        Stale base: resynchronize from the session-state in the problem when it carries one;
        so too for the bad request :meth:`on_verdict` raises for a genuine verdict of another
        request. Limit, bad proposal, q unavailable: the round is dropped, the base is
        unchanged. Anything else (stale epoch, not assigned, closed, a malformed verdict) ends
        this drafter's part.
        """
        self.outstanding = None
        if isinstance(problem, StaleBase):
            state = state_from_problem(problem)
            if state is not None:
                self.resync(state)
            return True
        if type(problem) is BadRequest:
            state = state_from_problem(problem)
            if state is not None and state.session == self.session and state.epoch == self.epoch:
                self.resync(state)
                return True
        if isinstance(problem, (Limit, BadProposal, QUnavailable)):
            return True
        self.stopped = Action.FAIL
        return False
