"""Rule 2 (§6.3 preconditions, §6.4) through the deployment's cache (adapters.py).

The kit does not know the target distribution p, except where the sampling profile makes it
one-hot: at temperature 0, p is the greedy token (§4.1), so with uniform q rows the greedy
proposed token is accepted (p/q = V >= 1), any other rejected (p = 0), and the additional
token drawn from max(0, p - q) is the greedy one, whatever the draws: every verdict is exact.
The seeded draws themselves (§6.4) would need p at a temperature above 0: not reachable.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING

from sdcp_fast.conform.driver import Scripted
from sdcp_fast.conform.expect import expected_emitted, wrong
from sdcp_fast.conform.report import Outcome
from sdcp_fast.protocol import Policy, Sampling, session_path_id
from sdcp_fast.protocol.messages import RULE_SPECULATIVE

if TYPE_CHECKING:
    from sdcp_fast.conform.kit import Conform

STATEMENTS = ("rule2-needs-q", "rule2-q-zero", "rule2-q-unavailable", "rule2-temperature-0", "policy-from-round")


def uniform_rows(vocab: int, m: int) -> bytearray:
    return bytearray(struct.pack(f"<{m * vocab}f", *([1.0 / vocab] * (m * vocab))))


async def rule2(kit: Conform) -> None:
    r = kit.report
    r.add("rule2-seeded", None, "needs the target distribution at a temperature above 0; the kit does not "
          "know the model")
    if not kit.can_put or kit.vocab is None:
        for check in STATEMENTS:
            r.add(check, None, "needs the cache the verifier reads q rows from (--mlc or --store) and --vocab")
        return
    greedy = await kit.greedy()
    c = kit.contract(RULE_SPECULATIVE, max_new=30)
    opened = kit.session_open(c)
    answer = await kit.post_session(opened)
    if answer.status == 422 and answer.suffix == "sdcp-bad-contract":
        for check in STATEMENTS:
            r.add(check, Outcome.INTERPRETATION, f"rule 2 is not supported ({answer.brief()}; Table 2 allows it)")
        return
    if answer.status != 200:
        r.add("rule2-temperature-0", False, f"a rule-2 session-open {answer.brief()}")
        return
    from sdcp_fast.protocol import SessionState

    s = Scripted(kit, c, greedy)
    s.opened = opened
    s.state = await kit.assign(opened, SessionState.decode(answer.body))
    v, scope, state = kit.vocab, kit.scope, s.state

    async def rows(data: bytes, salt: int = 0) -> str:
        assert s.state is not None
        return str(await kit.store.put(scope, opened.session, "q_rows", s.state.round + 1 + 1000 * salt, data))

    tokens = s.next_greedy(2)
    answer = await s.send(tokens)
    r.add("rule2-needs-q", 400 <= answer.status < 500, f"without q_rows {answer.brief()}")
    missing = kit.store.missing(scope, opened.session, "q_rows", state.round + 1)
    kit.refused("rule2-q-unavailable", await s.send(tokens, q_rows=missing), 409, "sdcp-q-unavailable")
    zero = uniform_rows(v, 2)
    struct.pack_into("<f", zero, 4 * (v + tokens[1]), 0.0)  # q[2](x[2]) = 0
    kit.refused("rule2-q-zero", await s.send(tokens, q_rows=await rows(bytes(zero), 1)), 422, "sdcp-bad-proposal")
    await s.after_refusals(tokens, "after rule-2 refusals", q_rows=await rows(bytes(uniform_rows(v, 2)), 2))
    # Exact rounds: greedy tokens accepted, a wrong one replaced by the greedy token.
    for i, m in enumerate((3, 2, 4)):
        g = s.next_greedy(m)
        proposal = g if i % 2 == 0 else (g[0], wrong(g[1]), *g[2:])
        if await s.round(proposal, q_rows=await rows(bytes(uniform_rows(v, m)), 3 + i)) is None:
            return
    # A policy from a later round: the rounds before it are still at temperature 0, exactly.
    assert s.state is not None
    start = s.state.round
    answer = await kit.as_router("POST", f"sessions/{session_path_id(opened.session)}/policy",
                                 Policy(session=opened.session, from_round=start + 3,
                                        sampling=Sampling(temperature_milli=1500, seed=11)).encode())
    if answer.status != 200:
        r.add("policy-from-round", False, f"a policy for round {start + 3} {answer.brief()}")
        return
    exact_before = True
    for k in range(2):
        g = s.next_greedy(2)
        proposal = (wrong(g[0]), g[1])
        want = expected_emitted(greedy, s.state.committed, proposal, c)
        verdict = await s.round(proposal, q_rows=await rows(bytes(uniform_rows(v, 2)), 10 + k))
        exact_before = exact_before and verdict is not None and (verdict.accepted, tuple(verdict.emitted)) == want
    r.add("policy-from-round", exact_before, f"rounds {start + 1}..{start + 2} before from_round {start + 3}")
