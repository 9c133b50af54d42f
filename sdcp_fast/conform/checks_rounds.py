"""Session creation (§6.1), authorization (§6.3), rule-1 rounds (§6.3, §6.4), output (§6.7),
and the proposals the verifier must refuse (§6.3, Table 2)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from sdcp_fast.conform.client import brief_output, find_session_state, prompt_tokens, state_mismatch
from sdcp_fast.conform.driver import Scripted, learn_greedy
from sdcp_fast.conform.expect import wrong
from sdcp_fast.conform.report import Outcome
from sdcp_fast.protocol import (
    Action,
    Output,
    Policy,
    Sampling,
    SessionState,
    Verdict,
    contract_digest,
    prefix_digest,
    session_path_id,
)

if TYPE_CHECKING:
    from sdcp_fast.conform.checker import Checker

NOT_US = "https://not-the-kit.invalid/"


async def session_creation(kit: Checker) -> None:
    r = kit.report
    c = kit.contract()
    opened = kit.session_open(c)
    answer = await kit.post_session(opened)
    if answer.status != 200:
        r.add("open-state", False, f"a valid session-open {answer.brief()}")
        return
    state = SessionState.decode(answer.body)
    d0 = prefix_digest(contract_digest(c), prompt_tokens(opened.prompt))
    r.add("open-state", (state.session, state.epoch, state.round, state.committed, state.digest)
          == (opened.session, 1, 0, 0, d0), f"round {state.round}, committed {state.committed}")
    # Another drafter is assigned: the kit's proposals are not its, whatever their epoch.
    await kit.assign(opened, state, NOT_US)
    answer = await kit.propose(kit.proposal(state, (1,)))
    kit.refused("assigned-only", answer, 403, "sdcp-not-assigned")
    answer = await kit.propose(kit.proposal(state, (1,), epoch=state.epoch + 1))
    kit.refused("auth-before-fencing", answer, 403, "sdcp-not-assigned", "another epoch, not assigned")
    # The kit's drafter is assigned, and the router's certificate proposes.
    state = await kit.assign(opened, state)
    answer = await kit.as_router("POST", "proposals", kit.proposal(state, (1,)).encode())
    kit.refused("router-proposes", answer, 403, "sdcp-not-assigned")
    answer = await kit.propose(kit.proposal(state, (1,)))
    v = Verdict.decode(answer.body) if answer.status == 200 else None
    r.add("refused-commits-nothing", v is not None and v.round == 1 and v.committed == len(v.emitted),
          f"round 1 after refused proposals {answer.brief()}")


async def rule1(kit: Checker) -> None:
    r = kit.report
    greedy = await learn_greedy(kit)
    s = await Scripted(kit, kit.contract(max_new=10), greedy).open()
    script = [lambda: s.next_greedy(2) + (wrong(s.next_greedy(3)[2]),), lambda: s.next_greedy(4),
              lambda: s.low_tokens(4), lambda: s.next_greedy(1)]
    i = 0
    while s.state is not None and s.state.committed < s.contract.max_new:
        v = await s.round(script[i % len(script)](), replay=True)
        i += 1
        if v is None or v.action in (Action.FINISH, Action.FAIL):
            break
    out = await kit.output_tokens(s.session, 0)
    r.add("output", out is not None and list(out.tokens) == s.committed and out.epoch == 1 and out.final
          and out.finish == Action.FINISH, brief_output(out))
    out = await kit.output_tokens(s.session, 4)
    r.add("output", out is not None and list(out.tokens) == s.committed[4:] and out.from_ == 4, brief_output(out))
    answer = await s.send((1,))
    kit.refused("closed-after-finish", answer, 410, "sdcp-session-closed")
    # A stop token inside a round: the first token at index >= 2 not seen before it.
    k = next((i for i in range(2, 24) if greedy[i] not in greedy[:i]), 0)
    s = await Scripted(kit, kit.contract(max_new=40, stop=(greedy[k],)), greedy).open()
    while s.state is not None and s.state.committed <= k:
        v = await s.round(s.next_greedy(4))
        if v is None or v.action in (Action.FINISH, Action.FAIL):
            break
        if s.state.committed > k:
            r.add("truncate-stop", False, f"committed {s.state.committed} tokens past the stop token at {k}")
    await concurrency(kit, greedy)


async def concurrency(kit: Checker, greedy: list[int]) -> None:
    """§6.3 identical requests in progress; §6.7 a waiting GET output."""
    r = kit.report
    s = await Scripted(kit, kit.contract(max_new=40), greedy).open()
    p = kit.proposal(s.state, s.next_greedy(3))  # type: ignore[arg-type]
    first, second = await asyncio.gather(kit.propose(p), kit.propose(p))
    same = first.status == second.status == 200 and Verdict.decode(first.body) == Verdict.decode(second.body)
    r.add("identical-in-progress", same, f"{first.brief()}, {second.brief()}")
    if first.status != 200:
        return
    v = Verdict.decode(first.body)
    s.state, s.m_cap = v, v.m_cap
    s.committed.extend(v.emitted)

    async def later() -> object:
        await asyncio.sleep(0.05)
        return await s.round(s.next_greedy(2))

    answer, verdict = await asyncio.gather(kit.output(s.session, len(s.committed)), later())
    out = Output.decode(answer.body) if answer.status == 200 else None
    emitted = list(getattr(verdict, "emitted", ()))
    r.add("output-wait", out is not None and not out.final and list(out.tokens) in ([], emitted),
          f"waited: {brief_output(out)}; the round committed {emitted}")


async def refusals(kit: Checker) -> None:
    r = kit.report
    greedy = await learn_greedy(kit)
    s = await Scripted(kit, kit.contract(max_new=40), greedy).open()
    await s.round(s.next_greedy(2))
    state = s.state
    assert state is not None
    kit.refused("stale-epoch", await s.send((1,), epoch=state.epoch + 1), 409, "sdcp-stale-epoch")
    for label, kw in (("base_digest", {"base_digest": bytes(32)}), ("base", {"base": state.committed + 1}),
                      ("round", {"round": state.round + 2})):
        answer = await s.send(s.next_greedy(1), **kw)
        kit.refused("stale-round" if label == "round" else "stale-base", answer, 409, "sdcp-stale-base", label)
        if answer.status == 409:
            mismatch = state_mismatch(find_session_state(answer.problem()), state)
            r.add("stale-state", not mismatch, f"{label}: {mismatch or 'current'}")
    kit.refused("limit-m-max", await s.send(tuple(greedy[:s.contract.m_max + 1])), 422, "sdcp-limit")
    await s.after_refusals(s.next_greedy(1), "after stale, limit refusals")
    await s.round(s.next_greedy(2), extra={"x-unknown": {"nested": [1, 2]}})
    r.add("unknown-keys", s.state is not None and s.state.round == state.round + 2, "a proposal with unknown keys")
    answer = await kit.as_router("POST", f"sessions/{session_path_id(s.session)}/policy",
                                 Policy(session=s.session, from_round=0,
                                        sampling=Sampling(temperature_milli=0)).encode())
    r.add("policy-past-round", Outcome.INTERPRETATION if answer.status == 200 else 400 <= answer.status < 500,
          f"from_round 0 {answer.brief()}")
