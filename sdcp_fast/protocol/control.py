"""Speculation limit and escalation counters of one session (draft §6.5).

Pure bookkeeping: the session feeds each verified round (a accepted out of M, verifier
load in percent) and gets the action, the next m_cap and the low-round count that go into
the verdict. Load enters only through its arguments.

Load rule (§6.5.1 leaves it local; see docs/interpretations.md): up to ``LOAD_KNEE``
percent the limit is m_max; above it the limit falls linearly to 1 at 100 percent. m_cap
never exceeds that limit, and grows back by one per round that is not low.
"""

from __future__ import annotations

from dataclasses import dataclass

from sdcp_fast.protocol.messages import LADDER_ACTIONS, Action, Contract

LOAD_KNEE = 70


def load_limit(m_max: int, load: int) -> int:
    """The largest m_cap the verifier grants at ``load`` percent."""
    if load <= LOAD_KNEE:
        return m_max
    spare = max(0, 100 - load)
    return max(1, m_max * spare // (100 - LOAD_KNEE))


def is_low(accepted: int, proposed: int, low_ratio: int | None) -> bool:
    """§6.5.2: low if ``100 * a < low_ratio * M``, or, with low_ratio zero or absent, if a = 0."""
    if low_ratio:
        return 100 * accepted < low_ratio * proposed
    return accepted == 0


def self_decode_permitted(contract: Contract, load: int) -> bool:
    """§6.5.2: only with self_load in the contract and load not above it."""
    return contract.self_load is not None and load <= contract.self_load


@dataclass(frozen=True)
class Decision:
    action: Action
    m_cap: int
    low: int  # consecutive low rounds, this one included, before an escalation resets c


class SpeculationControl:
    """Counters c, g, j and the current m_cap of one session.

    j persists across drafter changes and self-decoding periods: only a new session (or
    a fail-over, which starts a new control state) resets it.
    """

    def __init__(self, contract: Contract, m_cap: int | None = None) -> None:
        self.contract = contract
        self.m_cap = self._clamp(contract.m_max if m_cap is None else m_cap)
        self.c = 0
        self.g = 0
        self.j = 0

    def _clamp(self, m: int) -> int:
        return max(1, min(m, self.contract.m_max))

    def reset_cap(self, m_init: int) -> None:
        """A new assignment: the drafter starts from m_init (§6.2), clamped to [1, m_max]."""
        self.m_cap = self._clamp(m_init)

    def snapshot(self) -> tuple[int, int, int, int]:
        """(m_cap, c, g, j), to undo a round whose commit failed: it never happened."""
        return (self.m_cap, self.c, self.g, self.j)

    def restore(self, saved: tuple[int, int, int, int]) -> None:
        self.m_cap, self.c, self.g, self.j = saved

    def limit(self) -> int:
        """The largest M acceptable in the next proposal: min(m_max, m_cap)."""
        return min(self.contract.m_max, self.m_cap)

    def after_round(self, accepted: int, proposed: int, load: int) -> Decision:
        """Update the counters for a verified round and decide action and m_cap."""
        contract = self.contract
        low = is_low(accepted, proposed, contract.low_ratio)
        if low:
            self.c += 1
            self.g = 0
        else:
            self.c = 0
            self.g += 1
            if self.g >= contract.low_rounds:
                self.j = 0
        consecutive = self.c
        action = Action.CONTINUE
        if self.c >= contract.low_rounds:
            action = self._escalate(load)
            self.c = 0
        ceiling = load_limit(contract.m_max, load)
        if action is Action.REDUCE:
            self.m_cap = max(1, self.m_cap // 2)
        elif not low and self.m_cap < ceiling:
            self.m_cap += 1
        self.m_cap = self._clamp(min(self.m_cap, ceiling))
        return Decision(action, self.m_cap, consecutive)

    def _escalate(self, load: int) -> Action:
        ladder = self.contract.fallback
        while self.j < len(ladder):
            entry = Action.parse(ladder[self.j])
            self.j += 1
            if entry not in LADDER_ACTIONS:
                # Contract validation refuses such ladders; a receiver treats them as fail (§5.2).
                return Action.FAIL
            if entry is Action.SELF_DECODE and not self_decode_permitted(self.contract, load):
                continue
            return entry
        return Action.FAIL
