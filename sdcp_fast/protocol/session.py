"""The verifier's side of one SDCP session (draft §6.1, §6.3–§6.7, §6.9), sans I/O.

A :class:`VerifierSession` is fed messages and engine results and answers with the work
to do next. It never fetches, scores, appends or sleeps: the adapter does, and reports
back. The clock is an argument. Every refusal is an :class:`SdcpProblem`.

Driving loop of a continuous-batching engine (one session shown; a real engine collects
the ``ScoreNeeded`` of many sessions into one scoring pass)::

    session, state = VerifierSession.open(session_open, target_digest=model_digest,
                                          prompt_tokens=prompt)          # -> session-state
    session.assign(assignment)                                           # PUT .../drafter
    work = session.receive_proposal(proposal, client=peer, now=now)      # POST proposals
    if isinstance(work, Verdict):      # a retry of a recorded round: send it again
        ...
    elif isinstance(work, Pending):    # identical request in progress: when that round is
        ...                            # done or dropped, call receive_proposal again
    else:                              # ScoreNeeded
        uniforms = work.uniforms       # None for rule 1
        if work.needs_q:               # rule 2: q checked before any random value is drawn
            uniforms = session.provide_q(q_rows=raw_q_rows, vocab=V)   # or provide_q(q_of_x)
        p_rows = [profile_distribution(row, work.sampling) for row in scorer(work.context, work.proposed)]
        result = (greedy(p_rows, work.proposed) if work.rule == 1
                  else speculative(p_rows, q_rows, work.proposed, uniforms))
        append = session.complete_scoring(result.accepted, result.next_token, load=load)
        ok = commit_log.append(append.record)    # conditional append (§6.8)
        done = session.append_done(ok=ok, fenced=not ok and log_was_fenced)
        # RoundDone: send done.verdict, publish done.tokens at output index done.start,
        # send done.events to the router. Discarded: answer nothing, release nothing.

    while session.state is State.SELF_DECODING:   # after a self_decode verdict (§6.5.2)
        work = session.self_decode()               # ScoreNeeded with no proposed tokens
        ...                                        # score one position, pick the token
        session.complete_scoring(0, token, load=load)
        done = session.append_done(ok=True)        # after the append, as above

    session.output(from_index)                     # GET output?from=n
    session.policy(policy)                         # POST sessions/{id}/policy

Problems raised by ``provide_q`` (QUnavailable, BadProposal) are the answer to the
proposal; the round is already dropped when they are raised. ``abandon()`` drops a round
the engine could not score. Inputs fed in a state that does not take them raise
:class:`InvalidTransition` (a bug in the adapter, HTTP 500); ``TRANSITIONS`` is the table,
one next state per (state, input).

Why one module of this length: everything that decides a transition (the table, and each
input's checks in the draft's order) is kept together, as h11 keeps its state machine in one
file; split by input, the order of §6.3's checks would be spread over several files.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field

from sdcp_fast.protocol.acceptance import check_q, q_of_tokens
from sdcp_fast.protocol.commitlog import CommitRecord
from sdcp_fast.protocol.contract import contract_digest, parse_contract
from sdcp_fast.protocol.control import SpeculationControl, self_decode_permitted
from sdcp_fast.protocol.digests import extend_digest, prefix_digest
from sdcp_fast.protocol.messages import (
    RULE_SPECULATIVE,
    Action,
    Assignment,
    Contract,
    Event,
    Output,
    Policy,
    Proposal,
    Sampling,
    SessionOpen,
    SessionState,
    Verdict,
)
from sdcp_fast.protocol.peer import Peer, same_instance
from sdcp_fast.protocol.problems import (
    BadContract,
    BadProposal,
    BadRequest,
    Limit,
    NotAssigned,
    QUnavailable,
    SdcpProblem,
    SessionClosed,
    StaleBase,
    StaleEpoch,
)
from sdcp_fast.protocol.randoms import PURPOSE_ACCEPT, VerifierRandom


class InvalidTransition(SdcpProblem):
    """The adapter fed an input the session's state does not allow (a local bug, HTTP 500)."""

    suffix = "sdcp-invalid-transition"
    status = 500
    title = "Input not allowed in the session's state"


class State(enum.Enum):
    READY = "ready"  # waiting for a proposal
    SCORING = "scoring"  # a round is being verified: q rows and/or scores outstanding
    COMMITTING = "committing"  # commit record handed out, waiting for the append
    SELF_DECODING = "self-decoding"  # between self-decoded rounds (§6.5.2)
    FINISHED = "finished"
    FAILED = "failed"
    FENCED = "fenced"  # our append hit a fence: a newer epoch owns the session (§6.3)

    # Members are singletons compared by identity: the C slot hashes them as well as Enum's
    # Python-level hash of the name does, which every (state, input) lookup paid for.
    __hash__ = object.__hash__


class Input(enum.Enum):
    """What the adapter feeds a session. Where the outcome of a call decides the next state
    (a round that was self-decoded or proposed, a record whose round ends the session), the
    call feeds the input that names that outcome, as h11's events name theirs: each
    ``(state, input)`` then has one next state."""

    ASSIGN = "assign"
    POLICY = "policy"
    PROPOSAL = "proposal"
    UNASSIGNED = "unassigned"  # no drafter serves the session: the verifier decodes it (§6.5.2)
    SELF_DECODE = "self-decode"
    Q = "q"  # the rows check out: scoring goes on
    Q_REFUSED = "q-refused"  # no rows, or q(x) = 0: the round is dropped
    SCORED = "scored"
    ABANDON = "abandon"  # a proposed round could not be scored
    ABANDON_SELF = "abandon-self"  # a self-decoded round could not be scored
    APPEND_OK = "append-ok"  # committed; a drafter proposes next (continue, switch)
    APPEND_OK_SELF = "append-ok-self"  # committed; the verifier decodes next (self_decode)
    APPEND_OK_FINISH = "append-ok-finish"
    APPEND_OK_FAIL = "append-ok-fail"
    APPEND_FAILED = "append-failed"  # of a proposed round: the drafter's retry scores it again
    APPEND_FAILED_SELF = "append-failed-self"  # of a self-decoded round: decoded again
    APPEND_FENCED = "append-fenced"
    SUPERSEDE = "supersede"

    __hash__ = object.__hash__  # as State's


_S, _I = State, Input
_OPEN = (_S.READY, _S.SCORING, _S.COMMITTING, _S.SELF_DECODING)

TRANSITIONS: dict[tuple[State, Input], State] = {
    # Messages from the router and drafters, accepted while the session is open.
    **{(s, _I.ASSIGN): _S.READY if s is _S.SELF_DECODING else s for s in _OPEN},
    **{(s, _I.POLICY): s for s in _OPEN},
    (_S.READY, _I.PROPOSAL): _S.SCORING,
    # Answered without a new round (a recorded verdict, Pending for an identical retry) or
    # refused with the problem the draft names for the state (§6.3's order of checks).
    **{(s, _I.PROPOSAL): s for s in (_S.SCORING, _S.COMMITTING, _S.SELF_DECODING, _S.FINISHED, _S.FAILED)},
    # The round in progress.
    (_S.READY, _I.UNASSIGNED): _S.SELF_DECODING,
    (_S.SELF_DECODING, _I.SELF_DECODE): _S.SCORING,
    (_S.SCORING, _I.Q): _S.SCORING,
    (_S.SCORING, _I.Q_REFUSED): _S.READY,
    (_S.SCORING, _I.SCORED): _S.COMMITTING,
    (_S.SCORING, _I.ABANDON): _S.READY,
    (_S.SCORING, _I.ABANDON_SELF): _S.SELF_DECODING,
    (_S.COMMITTING, _I.APPEND_OK): _S.READY,
    (_S.COMMITTING, _I.APPEND_OK_SELF): _S.SELF_DECODING,
    (_S.COMMITTING, _I.APPEND_OK_FINISH): _S.FINISHED,
    (_S.COMMITTING, _I.APPEND_OK_FAIL): _S.FAILED,
    (_S.COMMITTING, _I.APPEND_FAILED): _S.READY,
    (_S.COMMITTING, _I.APPEND_FAILED_SELF): _S.SELF_DECODING,
    (_S.COMMITTING, _I.APPEND_FENCED): _S.FENCED,
    # A session-open with a higher epoch replaced this session at this verifier (§6.9).
    **{(s, _I.SUPERSEDE): _S.FENCED for s in (*_OPEN, _S.FINISHED, _S.FAILED)},
}
"""``(state, input) -> next state``; a missing pair is refused (see ``_refuse``)."""

_ENGINE_INPUTS = frozenset(set(Input) - {_I.ASSIGN, _I.POLICY, _I.PROPOSAL})
_MARKERS = {_S.FINISHED: Action.FINISH, _S.FAILED: Action.FAIL, _S.SELF_DECODING: Action.SELF_DECODE}
"""The session-state's ``state`` member of each state that has one."""

ROUND_LIMIT = 0xFFFFFFFF
"""The last round whose uniforms can be drawn: §6.4 packs the round as uint32."""


@dataclass(frozen=True)
class Uniforms:
    """The round's random values for positions i = 1..M+1: ``accept[i-1]`` (purpose 0) and
    ``draw[i-1]`` (purpose 1). Callable as the ``uniform(i, purpose)`` of acceptance.py."""

    accept: tuple[float, ...]
    draw: tuple[float, ...]

    def __call__(self, i: int, purpose: int) -> float:
        return (self.accept if purpose == PURPOSE_ACCEPT else self.draw)[i - 1]


@dataclass(frozen=True)
class ScoreNeeded:
    """Verify ``proposed`` (M tokens, M = 0 for a self-decoded round) after ``context``."""

    session: bytes
    round: int
    prompt: tuple[int, ...]
    output: tuple[int, ...]  # committed output o[1..n]
    proposed: tuple[int, ...]
    sampling: Sampling | None  # the profile in effect for this round (§6.6)
    rule: int
    needs_q: bool  # rule 2 with a proposal: call provide_q before using any uniform
    q_rows: str | None  # the proposal's cache-ref of its draft rows
    uniforms: Uniforms | None  # known now for rounds without q; else returned by provide_q
    self_decoded: bool = False

    @property
    def context(self) -> tuple[int, ...]:
        """Prompt followed by committed output: what the scorer conditions on."""
        return self.prompt + self.output


@dataclass(frozen=True)
class Pending:
    """An identical request is being verified; answer it with the verdict of ``round``."""

    round: int


@dataclass(frozen=True)
class AppendNeeded:
    """Append ``record`` to the commit log (§6.8), then call ``append_done``."""

    record: CommitRecord


@dataclass(frozen=True)
class RoundDone:
    """A committed round: send ``verdict`` (unless self-decoded), release ``tokens`` as output
    indices ``start..``, send ``events`` to the router."""

    verdict: Verdict
    start: int
    tokens: tuple[int, ...]
    events: tuple[Event, ...]


@dataclass(frozen=True)
class Discarded:
    """The round was dropped: nothing committed, nothing released."""

    round: int
    closed: bool


@dataclass
class _Round:
    round: int
    proposal: Proposal | None  # None for a self-decoded round
    sampling: Sampling | None
    uniforms: Uniforms | None = None
    q_checked: bool = False
    verdict: Verdict | None = None
    record: CommitRecord | None = None
    emitted: tuple[int, ...] = ()
    end: Action = Action.CONTINUE  # what the session does once the record is appended
    control_before: tuple[int, int, int, int] | None = None  # to undo the control step
    reassigned: bool = False  # an assignment arrived while this round was in progress


def _check_vocab(tokens: Sequence[int], vocab: int | None, problem: type[SdcpProblem],
                 what: str) -> None:
    if vocab is not None and tokens and max(tokens) >= vocab:
        raise problem(f"{what} token {max(tokens)} is outside the target's vocabulary of {vocab}")


def _same_request(a: Proposal, b: Proposal) -> bool:
    # The status member is a piggybacked load report and may differ between retries.
    return (a.round, a.drafter, a.base, a.base_digest, a.tokens, a.q_rows, a.draft_kv) == (
        b.round, b.drafter, b.base, b.base_digest, b.tokens, b.q_rows, b.draft_kv)


@dataclass
class VerifierSession:
    """One session at the verifier. Create it with :meth:`open`."""

    session: bytes
    epoch: int
    contract: Contract
    digest0: bytes
    prompt: tuple[int, ...]
    state: State = State.READY
    vocab: int | None = None  # the target's vocabulary size V, when the adapter told us
    round: int = 0  # last round with a verdict
    digest: bytes = b""  # d[n]
    drafter: str | None = None  # named in the latest assignment
    revoked: bool = False  # that drafter was told to stop (switch / self_decode)
    last_activity: float = 0.0
    control: SpeculationControl = field(init=False)
    _output: list[int] = field(default_factory=list)
    _verdicts: dict[int, Verdict] = field(default_factory=dict)
    _policies: list[Policy] = field(default_factory=list)
    _current: _Round | None = None
    _self_count: int = 0
    _self_stop: bool = False
    _assigned_at: int = 0  # rounds up to this one were decided before the latest assignment
    _random: VerifierRandom | None = None
    _random_seed: int | None = None

    def __post_init__(self) -> None:
        self.control = SpeculationControl(self.contract)
        if not self.digest:
            self.digest = self.digest0

    # -- creation -----------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        message: SessionOpen,
        *,
        target_digest: bytes,
        vocab: int | None = None,
        prompt_tokens: Sequence[int] | None = None,
        committed_tokens: Sequence[int] = (),
    ) -> tuple[VerifierSession, SessionState]:
        """Validate a session-open (§6.1) and answer its session-state.

        ``vocab`` is the target's vocabulary size V: with it, a prompt, resumed output or
        proposal holding a token id >= V is refused. ``prompt_tokens`` are the prompt when the
        message carries a cache-ref; on fail-over (``message.resume``), ``committed_tokens``
        are the output read from the resume's ``committed_tokens`` object, checked against its
        length and digest. Under rule 2 a resume at round 2^32 - 1 or later is refused: the
        next round's uniforms cannot be derived (§6.4 packs the round as uint32).
        """
        contract = parse_contract(message.contract)
        if contract.target != target_digest:
            raise BadContract("contract target does not match the verifier's model")
        if message.epoch < 1:
            raise BadRequest("epoch starts at 1")
        if vocab is not None and vocab < 1:
            raise BadRequest(f"vocabulary size {vocab} is not positive")
        if prompt_tokens is None:
            if isinstance(message.prompt, str):
                raise BadRequest("prompt is a cache-ref; its tokens are needed to open the session")
            prompt_tokens = message.prompt
        prompt = tuple(prompt_tokens)
        _check_vocab(prompt, vocab, BadRequest, "prompt")
        d0 = prefix_digest(contract_digest(contract), prompt)
        session = cls(session=message.session, epoch=message.epoch, contract=contract,
                      digest0=d0, prompt=prompt, vocab=vocab)
        resume = message.resume
        if resume is not None:
            if contract.rule == RULE_SPECULATIVE and resume.round >= ROUND_LIMIT:
                raise BadRequest(f"resume round {resume.round}: round {resume.round + 1} has no "
                                 "uint32 round number for its random values (§6.4)")
            _check_vocab(committed_tokens, vocab, BadRequest, "committed output")
            session._resume(resume.round, resume.committed, resume.digest, committed_tokens)
        elif committed_tokens:
            raise BadRequest("committed tokens given without a resume member")
        if session._finished():
            session.state = State.FINISHED
        return session, session.session_state()

    def _resume(self, round: int, committed: int, digest: bytes, tokens: Sequence[int]) -> None:
        tokens = tuple(tokens)
        if len(tokens) != committed or committed > self.contract.max_new:
            raise BadRequest(f"resume names {committed} committed tokens, {len(tokens)} were read")
        if extend_digest(self.digest0, tokens) != digest:
            raise BadRequest("resume digest does not match the committed tokens")
        self.round = round
        self._output = list(tokens)
        self.digest = digest

    def _finished(self) -> bool:
        out = self._output
        return len(out) >= self.contract.max_new or any(t in self.contract.stop for t in out)

    # -- views ----------------------------------------------------------------------------

    @property
    def committed(self) -> int:
        return len(self._output)

    @property
    def closed(self) -> bool:
        return self.state in (State.FINISHED, State.FAILED, State.FENCED)

    def session_state(self) -> SessionState:
        marker = _MARKERS.get(self.state)
        current = self._current
        if marker is None and current is not None and current.proposal is None and not self._self_stop:
            marker = Action.SELF_DECODE  # a self-decoded round in progress, with more to follow
        return SessionState(session=self.session, epoch=self.epoch, round=self.round,
                            committed=self.committed, digest=self.digest,
                            state=None if marker is None else int(marker))

    def sampling_for(self, round: int) -> Sampling | None:
        """The profile of ``round``: the latest policy with from_round <= round, else the
        contract's (§6.6). A policy replaces the whole profile."""
        chosen = self.contract.sampling
        for policy in self._policies:
            if policy.from_round <= round:
                chosen = policy.sampling
        return chosen

    def verdict_for(self, round: int) -> Verdict | None:
        return self._verdicts.get(round)

    def output(self, from_index: int) -> Output:
        """Released tokens at output indices >= ``from_index`` (0 is the first output token).

        Empty and not final means "none yet": the adapter waits and asks again (§6.7).
        """
        if self.state is State.FENCED:
            raise StaleEpoch("this verifier's epoch was fenced; the session moved")
        if from_index < 0:
            raise BadRequest("from must be a uint")
        final = self.state in (State.FINISHED, State.FAILED)
        finish = None
        if final:
            finish = Action.FINISH if self.state is State.FINISHED else Action.FAIL
        return Output(session=self.session, epoch=self.epoch, from_=from_index,
                      tokens=tuple(self._output[from_index:]), final=final, finish=finish)

    # -- transitions ----------------------------------------------------------------------

    def _check(self, event: Input) -> None:
        """Refuse ``event`` unless the table has a row for it in the current state."""
        if (self.state, event) not in TRANSITIONS:
            self._refuse(event)

    def _refuse(self, event: Input) -> None:
        if self.state is State.FENCED:
            raise StaleEpoch("this verifier's epoch was fenced; the session moved")
        if event in _ENGINE_INPUTS:
            raise InvalidTransition(f"{event.value} is not allowed while {self.state.value}")
        raise SessionClosed(f"session is {self.state.value}", extra=self._state_extra())

    def _move(self, event: Input) -> None:
        """Take the table's row for ``event``: its one next state."""
        state = TRANSITIONS.get((self.state, event))
        if state is None:  # the calls check their input first: this is a bug here
            raise InvalidTransition(f"{event.value} is not allowed while {self.state.value}")
        self.state = state

    def _state_extra(self) -> dict[str, object]:
        return {"session_state": self.session_state().to_map()}

    def _same_session(self, session: bytes) -> None:
        if session != self.session:
            raise BadRequest("message is for another session")

    def assign(self, assignment: Assignment) -> SessionState:
        """Record the latest assignment (PUT sessions/{id}/drafter, §6.1)."""
        self._check(Input.ASSIGN)
        self._same_session(assignment.session)
        if assignment.epoch != self.epoch:
            raise StaleEpoch(f"assignment epoch {assignment.epoch}, session epoch {self.epoch}",
                             extra=self._state_extra())
        if assignment.contract != self.contract:
            raise BadContract("assignment carries a different contract")
        self.drafter = assignment.drafter
        self.revoked = False
        self.control.reset_cap(assignment.m_init)
        current = self._current
        # Their verdicts answered someone else's request, or this drafter's under an earlier
        # assignment: their actions (a self-decoded round's self_decode, a switch) are not
        # addressed to the drafter assigned now (docs/interpretations.md, "Idempotency").
        self._assigned_at = self.round if current is None else current.round
        if current is not None:
            current.reassigned = True
            if current.control_before is not None:
                # Should this round's commit fail, undoing it must keep the new drafter's m_init.
                _, c, g, j = current.control_before
                current.control_before = (self.control.m_cap, c, g, j)
        if self.state is State.SELF_DECODING:
            self._self_count = 0
        elif self._current is not None and self._current.proposal is None:
            # Mid self-decoded round: the router wants a drafter back after it.
            self._self_stop = True
        self._move(Input.ASSIGN)
        return self.session_state()

    def policy(self, policy: Policy) -> SessionState:
        """Apply a sampling update from ``from_round`` on (POST sessions/{id}/policy, §6.6)."""
        self._check(Input.POLICY)
        self._same_session(policy.session)
        # A round in progress already has its profile: the update must start after it.
        current = self.round + (1 if self._current is not None else 0)
        if policy.from_round <= current:
            raise BadRequest(f"from_round {policy.from_round} is not after round {current}",
                             extra=self._state_extra())
        self._policies.append(policy)
        self._policies.sort(key=lambda p: p.from_round)
        self._move(Input.POLICY)
        return self.session_state()

    def receive_proposal(
        self, proposal: Proposal, *, client: str | Peer, now: float
    ) -> ScoreNeeded | Pending | Verdict:
        """The checks of §6.3 in the draft's order, then the work for the engine.

        ``client`` is the authenticated peer the transport hands over (:class:`Peer`, whose
        base URI is compared), or that base URI itself; the proposal's own ``drafter`` member
        authorizes nothing, it must merely agree.
        """
        self.last_activity = now
        self._same_session(proposal.session)
        if self.state is State.FENCED:
            raise StaleEpoch("this verifier's epoch was fenced; the session moved")
        identity = client.uri if isinstance(client, Peer) else client
        drafter = self.drafter
        if drafter is None or identity is None or not same_instance(identity, drafter):
            raise NotAssigned(f"{identity} is not the drafter of the latest assignment")
        if not same_instance(proposal.drafter, drafter):
            raise NotAssigned(f"the proposal names drafter {proposal.drafter}, not {drafter}")
        if proposal.epoch != self.epoch:
            raise StaleEpoch(f"proposal epoch {proposal.epoch}, session epoch {self.epoch}",
                             extra=self._state_extra())
        recorded = self._verdicts.get(proposal.round)
        if recorded is not None:
            if proposal.round <= self._assigned_at:
                raise StaleBase(f"round {proposal.round} was decided before the latest assignment",
                                extra=self._state_extra())
            return recorded
        current = self._current
        if current is not None and current.round == proposal.round:
            if current.proposal is not None and _same_request(current.proposal, proposal):
                return Pending(proposal.round)
            raise StaleBase("round is being verified for a different request",
                            extra=self._state_extra())
        self._check(Input.PROPOSAL)
        if self.closed:
            raise SessionClosed(f"session is {self.state.value}", extra=self._state_extra())
        if self.revoked or self.state is State.SELF_DECODING:
            raise NotAssigned("the drafter was told to stop proposing for this session")
        if proposal.base != self.committed or proposal.base_digest != self.digest:
            raise StaleBase("proposal does not extend the committed prefix", extra=self._state_extra())
        if proposal.round != self.round + 1 or current is not None:
            raise StaleBase(f"round {proposal.round} is not round {self.round + 1}",
                            extra=self._state_extra())
        m = len(proposal.tokens)
        if m == 0 or m > self.control.limit():
            raise Limit(f"M = {m}, limit min(m_max, m_cap) = {self.control.limit()}")
        # A token the target cannot score is refused before any work, under either rule.
        _check_vocab(proposal.tokens, self.vocab, BadProposal, "proposed")
        rule2 = self.contract.rule == RULE_SPECULATIVE
        if rule2 and proposal.q_rows is None:
            raise BadProposal("rule 2 needs q_rows")
        return self._start(Input.PROPOSAL, _Round(proposal.round, proposal, self.sampling_for(proposal.round)))

    def begin_self_decoding(self, *, load: int) -> bool:
        """A session no drafter serves (none was ever assigned, or the last one was told to
        stop and no other came) is decoded by the verifier itself, when the contract permits
        self-decoding at ``load`` (§6.5.2's condition; docs/interpretations.md, "Sessions
        without a drafter"). Returns whether self-decoding started; the period ends as an
        escalated one does (self_max, load, or an assignment)."""
        self._check(Input.UNASSIGNED)
        if (self.drafter is not None and not self.revoked) or not self_decode_permitted(self.contract, load):
            return False
        self._self_count = 0
        self._move(Input.UNASSIGNED)
        return True

    def drop_drafter(self, *, load: int) -> bool:
        """The router found no live drafter for a stalled session (docs/interpretations.md,
        "Taking the drafter away"): the drafter of record counts as told to stop, so that
        :meth:`begin_self_decoding` applies now. Returns whether the session is self-decoded;
        when the contract does not permit it at ``load``, nothing changes."""
        if self.state is State.SELF_DECODING:
            return True
        if self.state is not State.READY or not self_decode_permitted(self.contract, load):
            return False
        self.revoked = self.drafter is not None
        return self.begin_self_decoding(load=load)

    def self_decode(self) -> ScoreNeeded:
        """Start the next self-decoded round (M = 0, no proposal)."""
        self._check(Input.SELF_DECODE)
        round = self.round + 1
        return self._start(Input.SELF_DECODE, _Round(round, None, self.sampling_for(round), q_checked=True))

    def _start(self, event: Input, current: _Round) -> ScoreNeeded:
        """Begin ``current``: every value that can fail is computed before the state changes,
        so a refusal leaves the session as it was."""
        proposal = current.proposal
        rule2 = self.contract.rule == RULE_SPECULATIVE
        needs_q = proposal is not None and rule2
        if rule2 and current.round > ROUND_LIMIT:
            raise BadRequest(f"round {current.round} does not fit the uint32 of §6.4's derivation")
        if not needs_q:
            current.q_checked = True
            # Rule 1 draws nothing; a self-decoded rule-2 round draws from p[1] only.
            current.uniforms = self._uniforms(current) if rule2 else None
        self._current = current
        self._move(event)
        return ScoreNeeded(
            session=self.session, round=current.round, prompt=self.prompt,
            output=tuple(self._output), proposed=() if proposal is None else proposal.tokens,
            sampling=current.sampling, rule=self.contract.rule, needs_q=needs_q,
            q_rows=None if proposal is None else proposal.q_rows, uniforms=current.uniforms,
            self_decoded=proposal is None,
        )

    def _uniforms(self, current: _Round) -> Uniforms:
        seed = None if current.sampling is None else current.sampling.seed
        if self._random is None or self._random_seed != seed:
            self._random = VerifierRandom(seed, self.session)
            self._random_seed = seed
        m = 0 if current.proposal is None else len(current.proposal.tokens)
        accept, draw = self._random.round_values(current.round, m + 1)
        return Uniforms(accept=accept, draw=draw)

    def provide_q(
        self,
        q_of_x: Sequence[float] | None = None,
        *,
        q_rows: bytes | bytearray | memoryview | None = None,
        vocab: int | None = None,
    ) -> Uniforms:
        """Rule 2's precondition (§6.3): q[i](x[i]) for every proposed position, given directly
        or read from the raw q_rows object (``vocab`` = V, the session's when not given). With
        neither, the rows could not be obtained: the round is dropped with QUnavailable. A zero
        is BadProposal. Only after the check are the round's uniforms drawn and returned.
        Whatever is refused, the round is dropped: the session is never left waiting for it."""
        self._check(Input.Q)
        current = self._current
        assert current is not None
        if current.q_checked:
            raise InvalidTransition("q already provided for this round")
        proposal = current.proposal
        assert proposal is not None
        vocab = self.vocab if vocab is None else vocab
        try:
            if q_of_x is None:
                if q_rows is None or vocab is None:
                    raise QUnavailable(f"draft rows {proposal.q_rows} could not be obtained")
                q_of_x = q_of_tokens(q_rows, proposal.tokens, vocab)
            check_q(q_of_x, len(proposal.tokens))
            uniforms = self._uniforms(current)
        except SdcpProblem:
            self._current = None
            self._move(Input.Q_REFUSED)
            raise
        current.q_checked = True
        current.uniforms = uniforms
        self._move(Input.Q)
        return uniforms

    def abandon(self) -> Discarded:
        """Drop the round being scored (the engine could not score it); nothing is committed."""
        self._check(Input.ABANDON)
        current = self._current
        assert current is not None
        self._current = None
        self._move(Input.ABANDON if current.proposal is not None else Input.ABANDON_SELF)
        return Discarded(current.round, closed=False)

    def complete_scoring(self, accepted: int, next_token: int, *, load: int = 0) -> AppendNeeded:
        """The rule's result for the round: ``accepted`` proposed tokens, then ``next_token``.

        Truncates after the first stop token and at max_new, runs the control of §6.5, and
        hands out the commit record. Nothing is released before :meth:`append_done`.
        """
        self._check(Input.SCORED)
        current = self._current
        assert current is not None
        if not current.q_checked:
            raise InvalidTransition("rule 2: provide_q must come before the scoring result")
        proposed = () if current.proposal is None else current.proposal.tokens
        if not 0 <= accepted <= len(proposed):
            raise InvalidTransition(f"accepted = {accepted} outside 0..{len(proposed)}")
        if not 0 <= next_token <= 0xFFFFFFFF:
            raise InvalidTransition(f"token {next_token} does not fit in uint32")
        if not 0 <= load <= 100:
            raise InvalidTransition(f"load {load} is not a percentage")
        emitted = self._truncate((*proposed[:accepted], next_token))
        finished = self._finishes(emitted)
        if current.proposal is None:
            m_cap, low = self.control.m_cap, self.control.c
            action = Action.FINISH if finished else Action.SELF_DECODE
            current.end = self._self_end(finished, load)
        else:
            current.control_before = self.control.snapshot()
            decision = self.control.after_round(accepted, len(proposed), load)
            m_cap, low = decision.m_cap, decision.low
            action = Action.FINISH if finished else decision.action
            current.end = action
        n = self.committed + len(emitted)
        digest = extend_digest(self.digest, emitted)
        current.emitted = emitted
        current.verdict = Verdict(
            session=self.session, epoch=self.epoch, round=current.round, accepted=accepted,
            emitted=emitted, committed=n, digest=digest, action=action, m_cap=m_cap, low=low,
            load=load,
        )
        current.record = CommitRecord(epoch=self.epoch, round=current.round, emitted=emitted,
                                      committed=n, digest=digest)
        self._move(Input.SCORED)
        return AppendNeeded(current.record)

    def _truncate(self, emitted: tuple[int, ...]) -> tuple[int, ...]:
        stop = self.contract.stop
        for k, token in enumerate(emitted):
            if token in stop:
                emitted = emitted[: k + 1]
                break
        return emitted[: self.contract.max_new - self.committed]

    def _finishes(self, emitted: tuple[int, ...]) -> bool:
        return (self.committed + len(emitted) >= self.contract.max_new
                or any(t in self.contract.stop for t in emitted))

    def _self_end(self, finished: bool, load: int) -> Action:
        """After this self-decoded token: go on (SELF_DECODE), finish, or hand back (CONTINUE)."""
        if finished:
            return Action.FINISH
        count = self._self_count + 1
        limit = self.contract.self_max
        if (limit is not None and count >= limit) \
                or not self_decode_permitted(self.contract, load):
            return Action.CONTINUE
        return Action.SELF_DECODE

    def append_done(self, *, ok: bool, fenced: bool = False) -> RoundDone | Discarded:
        """The outcome of appending the round's commit record (§6.3 Commit, §6.8)."""
        event = Input.APPEND_OK if ok else (Input.APPEND_FENCED if fenced else Input.APPEND_FAILED)
        self._check(event)
        current = self._current
        assert current is not None and current.verdict is not None
        self._current = None
        if not ok:
            if current.control_before is not None:
                self.control.restore(current.control_before)
            if fenced:
                self._move(Input.APPEND_FENCED)
                return Discarded(current.round, closed=True)
            self._move(Input.APPEND_FAILED if current.proposal is not None else Input.APPEND_FAILED_SELF)
            return Discarded(current.round, closed=False)
        verdict = current.verdict
        start = self.committed
        self._output.extend(current.emitted)
        self.digest = verdict.digest
        self.round = current.round
        self._verdicts[current.round] = verdict
        events: list[Event] = []
        end = current.end
        if current.proposal is None:
            self._self_count += 1
            assigned = self._self_stop
            if end is Action.SELF_DECODE and assigned:
                end = Action.CONTINUE
            if end is Action.CONTINUE:
                if not assigned:
                    # The self-decoding period is over: the router assigns a drafter again.
                    events.append(self._event(Action.SELF_DECODE))
                self._self_count = 0
                self._self_stop = False
                outcome = Input.APPEND_OK
            elif end is Action.SELF_DECODE:
                outcome = Input.APPEND_OK_SELF
            else:
                outcome = Input.APPEND_OK_FINISH
        else:
            outcome = Input.APPEND_OK
            if end is Action.SWITCH:
                # A drafter assigned meanwhile is already the router's answer to a switch.
                self.revoked = not current.reassigned
                events.append(self._event(Action.SWITCH))
            elif end is Action.SELF_DECODE:
                self.revoked = True
                self._self_count = 0
                outcome = Input.APPEND_OK_SELF
            elif end in (Action.FINISH, Action.FAIL):
                outcome = Input.APPEND_OK_FINISH if end is Action.FINISH else Input.APPEND_OK_FAIL
        if outcome in (Input.APPEND_OK_FINISH, Input.APPEND_OK_FAIL):
            events.append(self._event(end))
        self._move(outcome)
        return RoundDone(verdict, start, current.emitted, tuple(events))

    def supersede(self) -> None:
        """A session-open with a higher epoch replaced this session here (§6.9): drop any round
        in progress, release nothing, and answer everything with sdcp-stale-epoch from now on."""
        if self.state is State.FENCED:
            return
        self._check(Input.SUPERSEDE)
        self._current = None
        self._move(Input.SUPERSEDE)

    def _event(self, kind: Action) -> Event:
        return Event(session=self.session, epoch=self.epoch, kind=kind,
                     committed=self.committed, digest=self.digest)

