"""The verifier's batch plan (§6.3 Scoring): what one scoring pass runs, as a value computed
from the sessions' plain state, the way a scheduler's step output is (no asyncio, no clock
read, no torch: times are passed in; :mod:`~sdcp_fast.roles.verifier_batch` runs the plan).

A pass scores queued rounds (up to ``max_batch``, in queue order), then one round of each
self-decoding session, then feeds prefill chunks. Prefill is chunked: a pass feeds at most
a budget of context tokens not yet in the model's cache. A first round whose context is no
longer than the M + 1 positions a decoding round carries is not charged (such a short prompt
costs a pass what a round does; charged, 3-token prompts would let only budget / 3 new
sessions into one); a longer one is charged in full, and a round it does not fit waits in
the queue. A session whose context is longer than ``prefill_chunk`` gets it fed in chunks
from its opening on, in the order the sessions were opened (a chunk is a request with no
proposal and a prefix of the context), and its first round joins a pass once the rest fits,
so a long prompt never holds the other sessions' rounds for longer than one chunk's work per
pass. A pass no decoding round shares (none queued or fetching its q rows, no session
self-decoding or owing a proposal, other than those being chunked) feeds up to
``prefill_solo`` tokens: the small chunk
protects other sessions' latency, and with none waiting it would only delay the long
prompt's first token. Beside decoding rounds the budget starts at ``prefill_chunk`` and
follows measured pass times up to ``prefill_solo`` (:class:`SharedBudget`): where a chunk
costs little next to a pass's fixed cost, larger chunks keep the rounds' latency and
shorten the prefill.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

# Context tokens one pass feeds at most, beside its decoding rounds, by default. A pass on a GPU
# costs about the same from a few tokens to some hundreds (reading the weights dominates); on a
# CPU its cost grows with its tokens from a few dozen on (docs/measurements.md, "Chunked prefill").
PREFILL_CHUNK_GPU = 512
PREFILL_CHUNK_CPU = 32
# Context tokens a pass that no decoding round shares feeds at most, by default: larger passes
# lose little to a pass's fixed cost, and a round arriving meanwhile waits for one such pass.
PREFILL_SOLO_GPU = 4096
PREFILL_SOLO_CPU = 512
# A shared pass's prefill budget follows measured pass times (from prefill_chunk up to
# prefill_solo): doubled after a pass that fed a full budget beside decoding rounds (or held a
# session's first round back for lack of it) in at most GROW_BELOW times a recent pass of
# decoding rounds alone, halved after one above SHRINK_ABOVE.
GROW_BELOW = 1.25
SHRINK_ABOVE = 1.75


class SessionNeed(NamedTuple):
    """What the plan needs to know of one session (a tuple: one is built per session and pass)."""

    key: int  # the caller's handle: equal keys are one session (in the queue and in the table)
    context: int  # prompt and committed output tokens
    fed: int = 0  # context positions already in the scorer's cache before its first round's pass
    prefilled: bool = False  # a pass fed its context: later passes feed only new tokens
    chunks_failed: bool = False  # a pass with a chunk of it failed: the rest goes in one pass, uncharged
    open: bool = True  # neither ended nor committing: it may be fed chunks
    self_decoding: bool = False
    owes: bool = False  # its drafter may send a proposal now

    @property
    def unfed(self) -> int:
        """Context tokens a pass of its first round would feed besides its proposal (the scorer
        recomputes at least the last one)."""
        return self.context - min(self.fed, self.context - 1)


class Queued(NamedTuple):
    """A drafter's round waiting for a pass: its session and its proposed tokens."""

    session: SessionNeed
    proposed: int


@dataclass(frozen=True, slots=True)
class Limits:
    """A pass's bounds: rounds, and context tokens beside decoding rounds (``shared_budget``)
    or without them (``prefill_solo``); ``prefill_chunk`` 0 feeds any context in one pass,
    ``prefill_solo`` 0 the rest of it when no round shares the pass."""

    max_batch: int
    prefill_chunk: int
    prefill_solo: int
    shared_budget: int


@dataclass(frozen=True, slots=True)
class Plan:
    """One scoring pass: positions in the queue and in the sessions given to :func:`plan`."""

    rounds: tuple[int, ...] = ()  # queued rounds it scores, in queue order; the others stay queued
    self_decoded: tuple[int, ...] = ()  # sessions it scores a self-decoded round of
    chunks: tuple[tuple[int, int], ...] = ()  # (session, context end it feeds to)
    shared: bool = False  # a decoding round takes or may soon take it: the shared budget applies
    held_back: bool = False  # beside decoding rounds, a round stayed queued for lack of budget
    decoding: bool = False  # a round of a prefilled session is in it: its time is learnt from
    prefill: int = 0  # context tokens charged to its rounds plus its chunks' tokens
    waiting: int = 0  # context tokens the sessions being chunked have yet to feed

    @property
    def empty(self) -> bool:
        return not (self.rounds or self.self_decoded or self.chunks)


def charge(need: SessionNeed, proposed: int) -> int:
    """The prefill budget a round of ``proposed`` tokens takes: none once its session is
    prefilled or when the context its pass feeds is no longer than the ``proposed`` + 1
    positions a decoding round carries, else all of that context."""
    if need.prefilled:
        return 0
    unfed = need.unfed
    return 0 if unfed <= proposed + 1 else unfed


def chunked(need: SessionNeed, prefill_chunk: int) -> bool:
    """Whether the session still needs prefill chunks before its first round's pass."""
    return (bool(prefill_chunk) and not need.prefilled and not need.chunks_failed and need.open
            and need.unfed > prefill_chunk)


def self_decode_due(opened: float, now: float, idle: float | None) -> bool:
    """Whether a session no drafter was assigned to since ``opened`` is to be self-decoded at
    ``now`` (local policy, docs/interpretations.md: after ``idle`` seconds; None: never)."""
    return idle is not None and now - opened >= idle


def pending(sessions: Sequence[SessionNeed], prefill_chunk: int) -> bool:
    """Whether a pass is due with no round queued: a session self-decodes or awaits a chunk."""
    return any(need.self_decoding or chunked(need, prefill_chunk) for need in sessions)


def plan(sessions: Sequence[SessionNeed], queue: Sequence[Queued], limits: Limits, *, fetching: int = 0) -> Plan:
    """The next pass over ``sessions`` (in the order they were opened; those prefilled that
    neither self-decode nor owe a proposal may be left out) and the ``queue`` (``fetching``:
    rounds still fetching their q rows, which will want a pass too)."""
    chunk = limits.prefill_chunk
    shared = bool(fetching) or any(not chunked(q.session, chunk) for q in queue) or any(
        (need.self_decoding or need.owes) and not chunked(need, chunk) for need in sessions)
    budget = (limits.shared_budget if shared else limits.prefill_solo) or None
    if not chunk:
        budget = None
    taken = 0
    held_back = False
    prefill = 0

    def fits(need: SessionNeed, proposed: int) -> bool:
        nonlocal budget, taken, held_back, prefill
        if taken >= limits.max_batch:
            return False
        charged = 0 if need.prefilled else charge(need, proposed)  # the common case, spared a call
        cost = 0 if need.chunks_failed else charged  # a failed chunk's rest is prefill all the same
        if budget is not None and cost > budget:
            held_back = held_back or shared
            return False
        if budget is not None:
            budget -= cost
        taken += 1
        prefill += charged
        return True

    rounds = tuple(i for i, q in enumerate(queue) if fits(q.session, q.proposed))
    self_decoded: list[int] = []
    for i, need in enumerate(sessions):
        if need.self_decoding:
            if taken >= limits.max_batch:
                break
            if fits(need, 0):
                self_decoded.append(i)
    in_pass = {queue[i].session.key for i in rounds} | {sessions[i].key for i in self_decoded}
    decoding = any(queue[i].session.prefilled for i in rounds) or any(sessions[i].prefilled for i in self_decoded)
    waiting = [i for i, need in enumerate(sessions) if not need.prefilled and chunked(need, chunk)]
    chunks: list[tuple[int, int]] = []
    for i in waiting:
        if budget is not None and budget <= 0:
            break
        need = sessions[i]
        if need.key in in_pass:
            continue
        n = need.context - 1 - need.fed
        if budget is not None:
            n = min(budget, n)
            budget -= n
        chunks.append((i, need.fed + n))
        prefill += n
    return Plan(rounds, tuple(self_decoded), tuple(chunks), shared=shared, held_back=held_back, decoding=decoding,
                prefill=prefill, waiting=sum(sessions[i].unfed for i in waiting))


class SharedBudget:
    """A shared pass's prefill budget, learnt from pass times (seconds, passed in)."""

    def __init__(self, prefill_chunk: int, prefill_solo: int, *, grow_below: float = GROW_BELOW,
                 shrink_above: float = SHRINK_ABOVE) -> None:
        self.prefill_chunk = prefill_chunk
        self.prefill_solo = prefill_solo
        self.grow_below = grow_below
        self.shrink_above = shrink_above
        self.value = prefill_chunk
        # Seconds per round of the last passes of decoding rounds alone: their median, times a
        # pass's rounds, is the reference (a spike of load would lift an average, and with it the
        # budget; per round, because with many sessions passes without any prefill are rare and
        # smaller than those with it).
        self._decode_seconds: deque[float] = deque(maxlen=16)

    def adapt(self, took: float, prefill: int, *, held_back: bool = False, rounds: int = 1) -> None:
        """Learn from a pass of ``rounds`` decoding rounds: alone, their time per round; beside
        ``prefill`` tokens, whether the budget may grow (its pass cost little more than its
        rounds alone, and it was all fed or ``held_back`` a round) or must shrink."""
        if not prefill:
            self._decode_seconds.append(took / max(1, rounds))
            return
        if not self.prefill_chunk or not self._decode_seconds:
            return
        alone = statistics.median(self._decode_seconds) * max(1, rounds)
        cap = self.prefill_solo or PREFILL_SOLO_CPU * self.prefill_chunk // PREFILL_CHUNK_CPU
        if took > self.shrink_above * alone:
            self.value = max(self.prefill_chunk, self.value // 2)
        elif took <= self.grow_below * alone and (prefill >= self.value or held_back):
            self.value = min(cap, 2 * self.value)
