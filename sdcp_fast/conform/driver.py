"""The sequence driver: the kit as router and drafter of one session, round after round.

:class:`Scripted` opens a session, assigns the kit's drafter, proposes, and checks each
verdict against what the draft makes exact: the digest chain (§4.2), rule 1's accepted and
emitted tokens on the greedy continuation the kit learned (§6.4, with §6.3's truncation), the
ladder's action and low count (§6.5.2), the reduced m_cap, and 1 <= m_cap <= m_max (§6.5.1).
The ladder and fail-over sequences (checks_ladder.py, checks_recovery.py) are scripts on it.
"""

from __future__ import annotations

from typing import Any

from sdcp_fast.conform.checker import GREEDY_LENGTH, Checker, ConformError
from sdcp_fast.conform.client import Answer
from sdcp_fast.conform.expect import LadderModel, expected_emitted, finishes, reduced, wrong
from sdcp_fast.conform.report import Outcome
from sdcp_fast.protocol import (
    Action,
    Contract,
    SessionOpen,
    SessionState,
    Verdict,
    deterministic_cbor,
    extend_digest,
)


class Scripted:
    def __init__(self, kit: Checker, c: Contract, greedy: list[int] | None, *, exact: bool = True,
                 ladder: bool = False) -> None:
        self.kit = kit
        self.contract = c
        self.greedy = greedy
        self.exact = exact and greedy is not None  # rule 1, or rule 2 at temperature 0 with uniform q
        self.model = LadderModel(c) if ladder else None
        self.opened: SessionOpen | None = None
        self.state: SessionState | Verdict | None = None
        self.m_cap = c.m_max  # the limit from the last verdict (m_init before the first)
        self.committed: list[int] = []

    async def open(self, m_init: int | None = None) -> Scripted:
        self.opened, self.state = await self.kit.open(self.contract, m_init=m_init)
        self.m_cap = m_init or self.contract.m_max
        return self

    async def reassign(self, drafter: str | None = None) -> SessionState:
        """A new assignment (§6.1) with m_init = the last m_cap, so the limit carries on."""
        assert self.opened is not None and self.state is not None
        state = await self.kit.assign(self.opened, self.state, drafter, m_init=self.m_cap)
        self.state = state
        return state

    @property
    def session(self) -> bytes:
        assert self.opened is not None
        return self.opened.session

    def next_greedy(self, m: int) -> tuple[int, ...]:
        assert self.greedy is not None and self.state is not None
        n = self.state.committed
        return tuple(self.greedy[n:n + m])

    def low_tokens(self, m: int) -> tuple[int, ...]:
        """M tokens whose first is not the greedy one: a = 0, a low round."""
        g = self.next_greedy(m)
        return (wrong(g[0]), *g[1:])

    async def send(self, tokens: tuple[int, ...], **kw: Any) -> Answer:
        assert self.state is not None
        return await self.kit.propose(self.kit.proposal(self.state, tokens, **kw))

    async def after_refusals(self, tokens: tuple[int, ...], what: str, **kw: Any) -> Verdict | None:
        """The round after refused proposals: it must be the next round, on the same prefix,
        with the verdict this proposal earns (an idempotent replay of a round the refusals
        committed behind the kit's back would carry another proposal's verdict)."""
        before = self.state
        assert before is not None
        want = expected_emitted(self.greedy, before.committed, tokens, self.contract) \
            if self.exact and self.greedy is not None else None
        v = await self.round(tokens, **kw)
        ok = v is not None and v.round == before.round + 1 and v.committed == before.committed + len(v.emitted)
        if ok and want is not None:
            assert v is not None
            ok = (v.accepted, tuple(v.emitted)) == want
        self.kit.report.add("refused-commits-nothing", ok, f"{what}: the next verdict "
                            + (f"round {v.round}, accepted {v.accepted}, emitted {v.emitted}; expected round "
                               f"{before.round + 1}" + (f", {want[0]}, {want[1]}" if want else "")
                               if v is not None else "was refused"))
        return v

    async def round(self, tokens: tuple[int, ...], *, replay: bool = False, extra: dict[str, Any] | None = None,
                    **kw: Any) -> Verdict | None:
        """One proposal on the committed prefix (with ``extra`` members, unknown to the draft);
        its verdict checked and adopted."""
        kit, r, state, c = self.kit, self.kit.report, self.state, self.contract
        assert state is not None
        p: Any = kit.proposal(state, tokens, **kw)
        if extra:
            m = p.to_map()
            m.update(extra)
            p = deterministic_cbor(m)
        answer = await kit.propose(p)
        if answer.status != 200:
            r.add("verdict-chain", False, f"a proposal on the committed prefix: {answer.brief()}")
            return None
        v = Verdict.decode(answer.body)
        a, m = v.accepted, len(tokens)
        problems = []
        if not 0 <= a <= m:
            problems.append(f"accepted {a} outside 0..M")
        if tuple(v.emitted[:a]) != tuple(tokens[:a][:len(v.emitted)]) or not v.emitted or len(v.emitted) > a + 1:
            problems.append(f"emitted {v.emitted} for {a} accepted of {tokens}")
        if v.committed != state.committed + len(v.emitted) or v.round != state.round + 1 or v.epoch != state.epoch:
            problems.append("committed/round/epoch do not follow")
        if v.digest != extend_digest(state.digest, v.emitted):
            problems.append("digest is not d[n] extended by the emitted tokens")
        r.add("verdict-chain", not problems, "; ".join(problems))
        r.add("m-cap-range", 1 <= v.m_cap <= c.m_max and v.load <= 100, f"m_cap {v.m_cap}, load {v.load}")
        finished = finishes(state.committed, v.emitted, c)
        if self.exact:
            assert self.greedy is not None
            want = expected_emitted(self.greedy, state.committed, tokens, c)
            label = "rule2-temperature-0" if c.rule == 2 else "rule1-exact"
            r.add(label, (a, tuple(v.emitted)) == want,
                  f"round {v.round}: accepted {a}, emitted {v.emitted}; expected {want[0]}, {want[1]}")
            if finished:
                check = "truncate-stop" if any(t in c.stop for t in want[1]) else "truncate-max-new"
                r.add(check, v.action == Action.FINISH and tuple(v.emitted) == want[1],
                      f"action {v.action.name if isinstance(v.action, Action) else v.action}, emitted {v.emitted}")
        if self.model is not None:
            expected = self.model.after(a, m, v.load, finished)
            r.add("ladder", v.action == expected.action,
                  f"round {v.round}: action {v.action!r}, expected {expected.action!r}")
            r.add("low-counter", v.low in expected.lows, f"round {v.round}: low {v.low}, expected {expected.lows}")
        if v.action == Action.REDUCE:
            r.add("reduce-halves", *reduced(self.m_cap, v.m_cap, v.load))
        elif self.model is not None and a == m and v.action == Action.CONTINUE and self.m_cap < c.m_max:
            grew = v.m_cap > self.m_cap
            r.add("m-cap-restore", True if grew else Outcome.INTERPRETATION,
                  f"m_cap {self.m_cap} -> {v.m_cap} after a round that was not low (load {v.load})")
        if replay:
            again = await kit.propose(p)
            same = again.status == 200 and Verdict.decode(again.body) == v  # "unchanged", in any encoding
            r.add("replay", same, f"replay {again.brief()}")
        self.state, self.m_cap = v, v.m_cap
        self.committed.extend(v.emitted)
        return v


async def learn_greedy(kit: Checker) -> list[int]:
    """The greedy continuation of the kit's prompt, from a rule-1 session whatever it proposes
    (§6.4); learned once per kit."""
    if kit.greedy is None:
        s = await Scripted(kit, kit.contract(max_new=GREEDY_LENGTH), None).open()
        while len(s.committed) < GREEDY_LENGTH:
            v = await s.round((s.committed[-1] if s.committed else 1,))
            if v is None:
                raise ConformError("a rule-1 proposal on the committed prefix was refused")
            if v.action in (Action.FINISH, Action.FAIL) and len(s.committed) < GREEDY_LENGTH:
                raise ConformError(f"the session ended after {len(s.committed)} of {GREEDY_LENGTH} tokens")
        kit.greedy = s.committed[:GREEDY_LENGTH]
    return kit.greedy
