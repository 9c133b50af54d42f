"""§6.5 through a whole ladder: the kit drives one session as router and drafter, low rounds
and full ones, and checks every verdict's action, low count and m_cap; it answers switch and
self_decode as the router would (a new assignment) and checks what the verifier decodes."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from sdcp_fast.conform.client import brief_output
from sdcp_fast.conform.driver import Scripted, learn_greedy
from sdcp_fast.conform.report import Outcome
from sdcp_fast.protocol import Action, Output, extend_digest

if TYPE_CHECKING:
    from sdcp_fast.conform.checker import Checker

R = 2
SELF_DECODE_WAIT = 10.0  # seconds for the self-decoded tokens to appear as output
# reduce; (two full rounds reset j) reduce again; switch; self_decode; reduce; then nothing is
# left: fail. self_max 1 < R, so however self-decoded rounds count, they cannot reset j.
FALLBACK = (int(Action.REDUCE), int(Action.SWITCH), int(Action.SELF_DECODE), int(Action.REDUCE))


async def ladder(kit: Checker) -> None:
    r = kit.report
    greedy = await learn_greedy(kit)
    c = kit.contract(m_max=8, max_new=44, low_rounds=R, low_ratio=100, fallback=FALLBACK, self_load=100,
                     self_max=1)
    s = await Scripted(kit, c, greedy, ladder=True).open()
    plan = ["low", "low", "full", "full", "low", "low", "low", "low", "low", "low", "low", "low", "low", "low"]
    checked_limit = False
    for step in plan:
        tokens = s.low_tokens(s.m_cap) if step == "low" else s.next_greedy(s.m_cap)
        v = await s.round(tokens)
        if v is None:
            return
        if v.action == Action.REDUCE and not checked_limit and v.m_cap < c.m_max:
            checked_limit = True
            kit.refused("limit-m-cap", await s.send(s.next_greedy(v.m_cap + 1)), 422, "sdcp-limit",
                        f"M {v.m_cap + 1} with m_cap {v.m_cap}")
            await s.after_refusals(s.next_greedy(1), "after sdcp-limit below m_max")
        if v.action == Action.SWITCH:
            await s.reassign()
            after = await s.round(s.low_tokens(s.m_cap))
            r.add("switch-reassign", after is not None, "a proposal after the new assignment")
        elif v.action == Action.SELF_DECODE:
            await self_decoding(kit, s, greedy)
        elif v.action == Action.FAIL:
            out = await kit.output_tokens(s.session, 0)
            r.add("ladder-exhausted", out is not None and out.final and out.finish == Action.FAIL
                  and list(out.tokens) == s.committed, f"final {brief_output(out)}")
            r.add("output", out is not None and out.final and out.finish == Action.FAIL, "after fail")
            kit.refused("closed-after-finish", await s.send((1,)), 410, "sdcp-session-closed", "after fail")
            break
        elif v.action == Action.FINISH:
            r.add("ladder-exhausted", False, f"the session finished after {v.committed} tokens, before the ladder")
            break
    else:
        r.add("ladder-exhausted", False, "no fail after the ladder's last entry")
    r.add("events", None, "events go to the router the verifier reports to; the kit is not that router")
    r.add("m-cap-load", None, "the kit cannot load the verifier from outside (the rule is the verifier's)")
    await unknown_action(kit, greedy)


async def self_decoding(kit: Checker, s: Scripted, greedy: list[int]) -> None:
    """After a self_decode verdict: the verifier commits self_max greedy tokens, one round
    each, then stops; a new assignment answers the session-state after them."""
    r = kit.report
    assert s.state is not None and s.contract.self_max is not None
    n, rnd, digest, want = s.state.committed, s.state.round, s.state.digest, s.contract.self_max
    tokens: list[int] = []
    deadline = asyncio.get_running_loop().time() + SELF_DECODE_WAIT
    while asyncio.get_running_loop().time() < deadline:
        answer = await kit.output(s.session, n + len(tokens))
        out = Output.decode(answer.body) if answer.status == 200 else None
        if out is None:
            break
        tokens.extend(out.tokens)
        if len(tokens) >= want or out.final:
            break
        if not out.tokens:
            await asyncio.sleep(0.05)  # a verifier whose output wait is short (§6.7: its choice)
    state = await s.reassign()
    expected = greedy[n:n + want]
    ok = tokens[:want] == expected and (state.round, state.committed, state.digest) == (
        rnd + want, n + want, extend_digest(digest, expected))
    r.add("self-decode", ok, f"self-decoded {tokens}, expected {expected}; then round {state.round}, "
          f"committed {state.committed} (expected {rnd + want}, {n + want})")
    s.committed.extend(expected)


async def unknown_action(kit: Checker, greedy: list[int]) -> None:
    """§5.2 at the verifier: a fallback entry the registry does not define is applied as fail
    once the rounds are low (or the contract is refused as not supported: interpretation)."""
    r = kit.report
    c = kit.contract(fallback=(9,), low_rounds=1, low_ratio=100, max_new=40)
    opened = kit.session_open(c)
    answer = await kit.post_session(opened)
    if answer.status != 200:
        r.add("unknown-action", Outcome.INTERPRETATION if answer.suffix == "sdcp-bad-contract" else False,
              f"the contract was refused ({answer.brief()})")
        return
    s = Scripted(kit, c, greedy)
    s.opened = opened
    from sdcp_fast.protocol import SessionState

    s.state = await kit.assign(opened, SessionState.decode(answer.body))
    v = await s.round(s.low_tokens(2))
    out = await kit.output_tokens(opened.session, 0)
    r.add("unknown-action", v is not None and v.action == Action.FAIL and out is not None and out.final
          and out.finish == Action.FAIL, f"action {getattr(v, 'action', None)!r}, {brief_output(out)}")
