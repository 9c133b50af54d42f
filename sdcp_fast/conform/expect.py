"""What a verdict must be, computed by the kit from the draft alone.

:func:`expected_emitted` is rule 1 (§6.4) on a prefix whose greedy continuation the kit knows,
with §6.3's truncation; :class:`LadderModel` is §6.5.2's counters c, g and j, giving the
action and the low count each verdict must carry. m_cap is checked where the draft is exact:
1 <= m_cap <= m_max always, and after reduce max(1, floor(m_cap / 2)), or lower only when the
verdict reports load (§6.5.1 lets a loaded verifier lower it further).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sdcp_fast.protocol import Action, Contract

LADDER = (Action.REDUCE, Action.SWITCH, Action.SELF_DECODE, Action.FAIL)


def wrong(token: int) -> int:
    """A token that is not ``token`` (and within any vocabulary that holds ``token`` and 0..1)."""
    return token - 1 if token > 0 else token + 1


def expected_emitted(greedy: Sequence[int], committed: int, tokens: Sequence[int], c: Contract) -> tuple[int, tuple[int, ...]]:
    """(accepted, emitted) of a rule-1 round at ``committed`` proposing ``tokens`` (§6.4, §6.3)."""
    rest = greedy[committed:]
    a = 0
    while a < len(tokens) and a < len(rest) and tokens[a] == rest[a]:
        a += 1
    emitted = tuple(rest[:a + 1])
    for k, token in enumerate(emitted):
        if token in c.stop:
            emitted = emitted[:k + 1]
            break
    return a, emitted[: c.max_new - committed]


def finishes(committed: int, emitted: Sequence[int], c: Contract) -> bool:
    return committed + len(emitted) >= c.max_new or any(t in c.stop for t in emitted)


@dataclass
class Expected:
    action: Action
    lows: tuple[int, ...]  # acceptable values of the verdict's `low`


class LadderModel:
    """§6.5.2 for one session: feed each verified round, get the verdict's action and low."""

    def __init__(self, c: Contract) -> None:
        self.contract = c
        self.c = self.g = self.j = 0

    def after(self, accepted: int, proposed: int, load: int, finished: bool) -> Expected:
        ratio = self.contract.low_ratio
        low = 100 * accepted < ratio * proposed if ratio else accepted == 0
        if low:
            self.c += 1
            self.g = 0
        else:
            self.c = 0
            self.g += 1
            if self.g >= self.contract.low_rounds:
                self.j = 0
        count = self.c
        action = Action.CONTINUE
        if self.c >= self.contract.low_rounds:
            action = self._escalate(load)
            self.c = 0
        if finished:
            action = Action.FINISH
        # The verdict that applies an entry reports the count that reached R, or c after its
        # reset: the draft says "consecutive low rounds" and resets c in the same step.
        lows = (count,) if action is Action.CONTINUE or count < self.contract.low_rounds else (count, 0)
        return Expected(action, lows)

    def _escalate(self, load: int) -> Action:
        ladder = self.contract.fallback
        while self.j < len(ladder):
            raw = ladder[self.j]
            self.j += 1
            entry = Action(raw) if raw in {int(a) for a in LADDER} else Action.FAIL
            if entry is Action.SELF_DECODE and not (self.contract.self_load is not None
                                                    and load <= self.contract.self_load):
                continue
            return entry
        return Action.FAIL


def reduced(previous: int, m_cap: int, load: int) -> tuple[bool, str]:
    """§6.5.2 reduce: m_cap = max(1, floor(previous / 2)); lower only under reported load."""
    half = max(1, previous // 2)
    ok = m_cap == half or (m_cap < half and load > 0)
    return ok, f"m_cap {previous} -> {m_cap} (expected {half}) at load {load}"
