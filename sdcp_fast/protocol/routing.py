"""The router's decisions (draft §6.1, §6.6, §6.9) as pure functions of what it knows.

The status table expires entries by a clock passed in; assignment, reassignment and
verifier fail-over come out as plans (messages and records to send or append, in order)
for the adapter to carry out.

Which instances are live, and which drafter or verifier is chosen, is
:mod:`sdcp_fast.protocol.status_table`.

Session ids come from the caller's randomness (:func:`new_session_id`): the core reads no
clock and no entropy.

Every function returning an :class:`Assignment` (``assign``, ``after_open``, ``on_event``,
``reassign_expired``) names the drafter; the adapter PUTs it to the verifier first and sends
the drafter ``confirmed(routed, state)``, built from the verifier's session-state answer::

    routed = RoutedSession(opened, epoch, verifier, m_init); state = POST sessions (routed.opened)
    a = after_open(routed, state, table, now)          # or on_event / reassign_expired
    state = PUT sessions/{id}/drafter (a); POST assignments (confirmed(routed, state))
    plan = plan_failover(routed, new_verifier, last_commit, committed_tokens=ref)
    append plan.fence; state = POST sessions (plan.open)
    if plan.policy: POST sessions/{id}/policy (plan.policy); then plan.later, in order
    then after_open as above

    for routed in expired_verifiers(sessions, table, now): plan_failover(routed, choose_verifier(...), ...)

The watchdog (docs/reliability.md, "Drafter death"): :func:`note_progress` records each growth
of the committed length the router sees (events, output, answers); a session that shows none
for :func:`stall_after` seconds (a few of its drafter's ttl_ms) is asked where it stands, by
sending its session-open again (idempotent, §6.1), and :func:`after_probe` decides from the
answer: it moved on, the verifier decodes it itself, or it gets a drafter again. A drafter
that expired is replaced the same way (:func:`expired_drafters`, then :func:`after_probe`), so
a session the verifier decodes itself (its drafter was told to stop) is left to it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from sdcp_fast.protocol.commitlog import CommitRecord, FenceRecord
from sdcp_fast.protocol.messages import (
    Action,
    Assignment,
    Contract,
    Event,
    Policy,
    Resume,
    Sampling,
    SessionOpen,
    SessionState,
)
from sdcp_fast.protocol.problems import BadRequest
from sdcp_fast.protocol.status_table import StatusTable, choose_drafter


def new_session_id(entropy: bytes) -> bytes:
    """A session id (§5.2, 16 bytes) from 16 random bytes the caller drew (``os.urandom(16)``).

    Ids must not repeat across sessions: §6.4's seeded HMAC covers the session id, so two
    sessions with one id and one seed would draw the same random values. A seeded run is
    reproduced by the contract's seed together with the id of the run being reproduced.
    """
    if not isinstance(entropy, (bytes, bytearray)) or len(entropy) != 16:
        raise BadRequest("a session id needs exactly 16 random bytes")
    return bytes(entropy)


@dataclass
class Watch:
    """The router's own bookkeeping of a session, in memory only: whichever process routes the
    session starts it afresh, and the verifier's answers fill it in again."""

    tried: set[str] = field(default_factory=set)  # drafters switched away from
    handled: set[tuple[int, int, int, bytes]] = field(default_factory=set)  # events acted on
    progress: float | None = None  # when the committed length last grew, as far as the router saw
    seen: int = -1  # that length
    self_decoding: bool = False  # the verifier decodes it itself: its drafter was told to stop


@dataclass
class RoutedSession:
    """One session as the router routes it, and its routing record (docs/interpretations.md,
    "Routing records"): protocol/routing_records.py encodes its persisted part for the MLC and
    decodes that into this record again.

    Persisted: ``opened`` (the session-open its verifier holds; the session, contract, prompt
    and commit log are its), ``router``, ``verifier``, ``drafter``, ``m_init``, ``writers``,
    ``policies``, ``sampling``, ``committed_tokens``, ``done`` and ``request``: what another
    router needs to take the session over and answer its client's resume.

    Not persisted: ``epoch`` (the open's, or the next one while a fail-over opens it; the
    encoding names the open's, which the verifier holds), ``round``, ``committed`` and
    ``digest`` (where the verifier last said the session stands: decoding starts them at the
    open's resume, and the verifier's answer to that open sent again is authoritative), and
    ``watch``, the router's own bookkeeping.
    """

    opened: SessionOpen
    epoch: int
    verifier: str
    m_init: int
    round: int = 0
    committed: int = 0
    digest: bytes = bytes(32)
    drafter: str | None = None
    router: str = ""  # the base URI of the router that routes it now
    writers: dict[int, str] = field(default_factory=dict)  # epoch -> its verifier, who names its committed_tokens
    sampling: Sampling | None = None  # latest policy update, carried in assignments (§6.6)
    policies: list[Policy] = field(default_factory=list)  # every update sent, by from_round
    committed_tokens: str | None = None
    done: bool = False
    request: dict[str, object] | None = None  # the client's request body (JSON), for a resume to match
    watch: Watch = field(default_factory=Watch)

    @property
    def session(self) -> bytes:
        return self.opened.session

    @property
    def contract(self) -> Contract:
        return self.opened.contract

    @property
    def prompt(self) -> tuple[int, ...] | str:
        return self.opened.prompt

    @property
    def commit_log(self) -> str:
        return self.opened.commit_log

    def follow(self, state: SessionState | Event) -> None:
        """Adopt the verifier's latest round, committed length and digest."""
        if state.epoch != self.epoch:
            return
        if isinstance(state, SessionState):
            # The verifier's answer is authoritative, also when it is behind our record
            # (a fresh open after a fail-over with nothing committed).
            self.round, self.committed, self.digest = state.round, state.committed, state.digest
        elif state.committed >= self.committed:
            self.committed = state.committed
            self.digest = state.digest


def assignment_for(routed: RoutedSession, drafter: str) -> Assignment:
    """The assignment message: PUT to the verifier first, then POST to the drafter (§6.1)."""
    return Assignment(
        session=routed.session, epoch=routed.epoch, contract=routed.contract,
        verifier=routed.verifier, drafter=drafter, prompt=routed.prompt, round=routed.round,
        committed=routed.committed, digest=routed.digest, m_init=routed.m_init,
        sampling=routed.sampling, committed_tokens=routed.committed_tokens,
    )


def assign(routed: RoutedSession, table: StatusTable, now: float, *,
           exclude: Iterable[str] = ()) -> Assignment | None:
    """Pick a drafter for the session and build its assignment; None if none is live."""
    drafter = choose_drafter(table, routed.contract, now, exclude=exclude)
    if drafter is None:
        return None
    routed.drafter = drafter
    routed.watch.self_decoding = False
    return assignment_for(routed, drafter)


def open_message(routed: RoutedSession, *, resume: Resume | None = None) -> SessionOpen:
    return SessionOpen(session=routed.session, epoch=routed.epoch, contract=routed.contract,
                       prompt=routed.prompt, commit_log=routed.commit_log, resume=resume)


def policy_update(routed: RoutedSession, from_round: int, sampling: Sampling) -> Policy:
    """A sampling update (§6.6); later assignments carry it. from_round must exceed the
    current round: the verifier refuses it otherwise."""
    routed.sampling = sampling
    policy = Policy(session=routed.session, from_round=from_round, sampling=sampling)
    routed.policies.append(policy)
    routed.policies.sort(key=lambda p: p.from_round)
    return policy


def on_event(routed: RoutedSession, event: Event, table: StatusTable, now: float) -> Assignment | None:
    """POST events: switch picks another drafter, the end of self-decoding any drafter;
    finish and fail close the session. Events of another epoch are ignored.

    Idempotent: an event the router already acted on (same epoch, kind, committed and
    digest; every round commits a token, so these name one event) is answered None, so a
    redelivered switch reassigns once. An event that found no drafter counts as not acted on.
    """
    if event.epoch != routed.epoch or event.session != routed.session:
        return None
    key = (event.epoch, int(event.kind), event.committed, event.digest)
    if key in routed.watch.handled:
        return None
    assignment = _apply_event(routed, event, table, now)
    if assignment is not None or routed.done:
        routed.watch.handled.add(key)
    return assignment


def _apply_event(routed: RoutedSession, event: Event, table: StatusTable, now: float) -> Assignment | None:
    routed.follow(event)
    kind = Action.parse(int(event.kind))
    if kind in (Action.FINISH, Action.FAIL):
        routed.done = True
        return None
    if kind is Action.SWITCH:
        if routed.drafter is not None:
            routed.watch.tried.add(routed.drafter)
        assignment = assign(routed, table, now, exclude=routed.watch.tried)
        if assignment is None:
            # Every permitted drafter was tried: start the rotation again rather than stall,
            # and when the current drafter is the only live one, keep it, so that the ladder
            # goes on to its next entry instead of leaving the session unassigned.
            routed.watch.tried.clear()
            assignment = assign(routed, table, now, exclude=() if routed.drafter is None else (routed.drafter,))
            if assignment is None:
                assignment = assign(routed, table, now)
        return assignment
    if kind is Action.SELF_DECODE:
        return assign(routed, table, now)
    return None


def reassign_expired(
    sessions: Iterable[RoutedSession], table: StatusTable, now: float
) -> list[Assignment]:
    """Drafter failure (§6.9): sessions whose drafter's status expired get a new drafter
    (not those the verifier decodes itself: that drafter had been told to stop already)."""
    plans = []
    for routed in sessions:
        if routed.done or routed.drafter is None or routed.watch.self_decoding or table.live(routed.drafter, now):
            continue
        assignment = assign(routed, table, now, exclude=(routed.drafter,))
        if assignment is not None:
            plans.append(assignment)
    return plans


def expired_drafters(sessions: Iterable[RoutedSession], table: StatusTable, now: float) -> list[RoutedSession]:
    """Drafter failure (§6.9): open sessions whose drafter's status expired and that another
    live drafter could take, each to be asked where it stands, then :func:`after_probe`. A
    session the verifier decodes itself is left alone: its drafter was told to stop, and
    assigning another would end the self-decoding its ladder chose. A session whose verifier
    expired too is left to :func:`expired_verifiers`: its fail-over assigns a drafter."""
    return [r for r in sessions
            if not r.done and r.drafter is not None and not r.watch.self_decoding and not table.live(r.drafter, now)
            and not table.expired(r.verifier, now)
            and choose_drafter(table, r.contract, now, exclude=(r.drafter,)) is not None]


def note_progress(routed: RoutedSession, committed: int, now: float) -> bool:
    """The router saw ``committed`` tokens committed at ``now``; whether that is progress."""
    if routed.watch.progress is not None and committed <= routed.watch.seen:
        return False
    routed.watch.seen = max(committed, routed.watch.seen)
    routed.watch.progress = now
    return True


def stall_after(routed: RoutedSession, table: StatusTable, *, ttls: float = 3.0, default: float = 10.0) -> float:
    """Seconds without progress after which the session is looked at: ``ttls`` times its
    drafter's ttl_ms (``default`` seconds when the router knows none)."""
    ttl = None if routed.drafter is None else table.ttl(routed.drafter)
    return ttls * (ttl if ttl is not None else default / ttls)


def stalled(sessions: Iterable[RoutedSession], table: StatusTable, now: float, *, ttls: float = 3.0) -> list[RoutedSession]:
    """Open sessions that showed no progress for :func:`stall_after` seconds, but for those
    whose verifier's status expired: they are :func:`expired_verifiers`' to fail over, and
    asking a hung verifier where they stand would hold the sweep until the call times out."""
    return [r for r in sessions
            if not r.done and r.watch.progress is not None and now - r.watch.progress >= stall_after(r, table, ttls=ttls)
            and not table.expired(r.verifier, now)]


def after_probe(routed: RoutedSession, state: SessionState, table: StatusTable, now: float) -> Assignment | None:
    """The verifier's session-state for a session whose drafter expired or that looked
    stalled: None when it progressed, ended, or is decoded by the verifier itself; else a
    drafter is assigned (another one when one is live, else the same one again: a new
    assignment restarts it from the verifier's state). None also when no drafter is live."""
    if state.epoch != routed.epoch:
        return None
    routed.follow(state)
    moved = note_progress(routed, state.committed, now)
    marker = None if state.state is None else Action.parse(int(state.state))
    if marker in (Action.FINISH, Action.FAIL):
        return None  # the output reader sees the end
    if marker is Action.SELF_DECODE:
        routed.watch.self_decoding = True  # the ladder chose it; the verifier's event ends it
        routed.watch.progress = now
        return None
    routed.watch.self_decoding = False
    expired = routed.drafter is not None and not table.live(routed.drafter, now)
    if moved and not expired:
        return None
    routed.watch.progress = now  # the next look comes a full period later
    exclude = () if routed.drafter is None else (routed.drafter,)
    return assign(routed, table, now, exclude=exclude) or assign(routed, table, now)


def expired_verifiers(
    sessions: Iterable[RoutedSession], table: StatusTable, now: float
) -> list[RoutedSession]:
    """Verifier failure (§6.9): the open sessions whose verifier's status has expired, each
    to move with :func:`plan_failover` to a verifier from :func:`choose_verifier`."""
    return [r for r in sessions if not r.done and table.expired(r.verifier, now)]


@dataclass(frozen=True)
class FailoverPlan:
    """Verifier fail-over (§6.9), in order: append ``fence`` to the commit log; POST ``open``
    to the new verifier; then, when the session's sampling was updated, POST ``policy`` (the
    profile in effect from the resumed round + 1 on) and each of ``later`` (updates scheduled
    after that round); only then assign a drafter (:func:`after_open`). The new verifier
    knows only the contract's profile, so the policies must reach it before any proposal."""

    fence: FenceRecord
    open: SessionOpen
    policy: Policy | None = None
    later: tuple[Policy, ...] = ()


def fence_for(routed: RoutedSession) -> FenceRecord:
    """The fence with the next epoch: appended before anything else of a fail-over."""
    return FenceRecord(epoch=routed.epoch + 1)


def plan_failover(
    routed: RoutedSession,
    new_verifier: str,
    last_commit: CommitRecord | None,
    *,
    committed_tokens: str | None = None,
    target_kv: str | None = None,
) -> FailoverPlan:
    """Move the session to ``new_verifier`` at the next epoch.

    ``last_commit`` is the last commit record read after the fence (None: nothing was
    committed, so the session opens afresh); ``committed_tokens`` names the MLC object
    holding the committed output, which a resume needs.
    """
    fence = fence_for(routed)
    routed.epoch = fence.epoch
    routed.verifier = new_verifier
    resume = None
    if last_commit is not None:
        if committed_tokens is None:
            raise ValueError("a resume needs the committed_tokens object")
        routed.committed_tokens = committed_tokens
        resume = Resume(round=last_commit.round, committed=last_commit.committed,
                        digest=last_commit.digest, committed_tokens=committed_tokens,
                        target_kv=target_kv)
    first = 1 + (0 if last_commit is None else last_commit.round)
    policy, later = _policies_from(routed.policies, first)
    return FailoverPlan(fence=fence, open=open_message(routed, resume=resume), policy=policy, later=later)


def _policies_from(policies: list[Policy], first: int) -> tuple[Policy | None, tuple[Policy, ...]]:
    """The profile in effect at round ``first``, restated from ``first`` on, and the updates
    that start after it (§6.6: each must name a round after the verifier's current one)."""
    current = None
    for policy in policies:
        if policy.from_round <= first:
            current = policy
    later = tuple(p for p in policies if p.from_round > first)
    return (None if current is None else replace(current, from_round=first)), later


def after_open(routed: RoutedSession, state: SessionState, table: StatusTable, now: float) -> Assignment | None:
    """The verifier answered session-open (first open or fail-over): assign a drafter,
    keeping the current one while its status is live (§6.1, §6.9)."""
    routed.follow(state)
    if routed.drafter is not None and table.live(routed.drafter, now):
        return assignment_for(routed, routed.drafter)
    return assign(routed, table, now)


def confirmed(routed: RoutedSession, state: SessionState) -> Assignment:
    """The assignment for the drafter, built from the session-state the verifier answered to
    PUT sessions/{id}/drafter, so it carries the verifier's current round, length and digest."""
    if routed.drafter is None:
        raise ValueError("no drafter chosen")
    routed.follow(state)
    return assignment_for(routed, routed.drafter)

