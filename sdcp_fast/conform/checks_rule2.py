"""Rule 2 (§6.3 preconditions, §6.4) through the deployment's cache (adapters.py).

The kit does not know the target distribution p, except where the sampling profile makes it
one-hot: at temperature 0, p is the greedy token (§4.1), so with uniform q rows the greedy
proposed token is accepted (p/q = V >= 1), any other rejected (p = 0), and the additional
token drawn from max(0, p - q) is the greedy one, whatever the draws: every verdict is exact.
With an oracle of the target's logits (oracles.py), the kit also checks rounds under a seeded
profile above temperature 0: each acceptance test r < min(1, p/q) with r from §6.4's HMAC is
predicted, so the verdict's accepted count is exact, and its additional token must be one the
residual max(0, p - q) (or p[M+1]) gives weight to. How a draw maps r to a token the draft does
not say, so the token itself is not predicted. Without an oracle this is not reachable.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING, Any

from sdcp_fast.conform.driver import Scripted, learn_greedy
from sdcp_fast.conform.expect import expected_emitted, wrong
from sdcp_fast.conform.report import Outcome
from sdcp_fast.protocol import Policy, Sampling, session_path_id
from sdcp_fast.protocol.messages import RULE_SPECULATIVE

if TYPE_CHECKING:
    from sdcp_fast.conform.checker import Checker

STATEMENTS = ("rule2-needs-q", "rule2-q-zero", "rule2-q-unavailable", "rule2-temperature-0", "policy-from-round",
              "rule2-seeded")


def uniform_rows(vocab: int, m: int) -> bytearray:
    return bytearray(struct.pack(f"<{m * vocab}f", *([1.0 / vocab] * (m * vocab))))


async def rule2(kit: Checker) -> None:
    r = kit.report
    if kit.oracle is None:
        r.add("rule2-seeded", None, "needs the target distribution at a temperature above 0 (--oracle)")
    if not kit.can_put or kit.vocab is None:
        for check in STATEMENTS:
            r.add(check, None, "needs the cache the verifier reads q rows from (--mlc or --store) and --vocab")
        return
    greedy = await learn_greedy(kit)
    c = kit.contract(RULE_SPECULATIVE, max_new=44)
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
    if kit.oracle is not None:
        await seeded(kit, s, Sampling(temperature_milli=1500, seed=11), rows)


async def seeded(kit: Checker, s: Scripted, profile: Sampling, rows: Any) -> None:
    """Rounds under the policy's seeded profile, each predicted from the oracle's logits."""
    from sdcp_fast.protocol.acceptance import profile_distribution
    from sdcp_fast.protocol.randoms import VerifierRandom

    r, v = kit.report, kit.vocab
    assert v is not None and profile.seed is not None and s.opened is not None
    draws = VerifierRandom(profile.seed, s.session)
    s.exact = False  # the committed prefix leaves the greedy continuation here
    for k in range(8):
        state = s.state
        assert state is not None
        if state.committed + 4 > s.contract.max_new:
            break
        context = [*s.opened.prompt, *s.committed]
        tokens: list[int] = []
        for _ in range(3):  # the oracle's greedy chain: likely tokens, so the tests are not all rejections
            tokens.append(max(range(v), key=kit.oracle.logits(context + tokens, [])[0].__getitem__))
        q = bytearray(struct.pack(f"<{3 * v}f", *([0.5 / (v - 1)] * (3 * v))))
        for i, x in enumerate(tokens):
            struct.pack_into("<f", q, 4 * (i * v + x), 0.5)
        q_rows = [list(struct.unpack_from(f"<{v}f", q, 4 * i * v)) for i in range(3)]
        p = [profile_distribution(row, profile) for row in kit.oracle.logits(context, tokens)]
        rnd = state.round + 1
        a = 0
        while a < 3 and draws.uniform(rnd, a + 1, 0) < min(1.0, p[a][tokens[a]] / q_rows[a][tokens[a]]):
            a += 1
        verdict = await s.round(tuple(tokens), q_rows=await rows(bytes(q), 20 + k))
        if verdict is None:
            return
        extra = verdict.emitted[verdict.accepted] if len(verdict.emitted) > verdict.accepted else None
        weight = (p[3] if a == 3 else [max(0.0, pk - qk) for pk, qk in zip(p[a], q_rows[a], strict=True)])
        ok = verdict.accepted == a and (extra is None or weight[extra] > 0.0)
        detail = f"round {rnd}: accepted {verdict.accepted}, expected {a}; additional token {extra}"
        r.add("rule2-seeded", ok, detail)
        r.add("policy-from-round", ok, f"the new profile from from_round: {detail}")
