"""Drafter death, each way it once stalled or failed a session (docs/reliability.md, "Drafter
death"; §6.3, §6.5.2, §6.9):

- a drafter assigned while the verifier decodes a round itself was answered that round's
  recorded verdict (action self_decode) for its first proposal, stopped, and the verifier
  waited for it for good;
- the expiry of a drafter already told to stop made the router assign another one, which
  ended the self-decoding the contract's ladder had chosen, and the used-up ladder then
  failed the session;
- nothing looked at a session that committed nothing while its drafter stayed live: the
  router's watchdog now does, after a few ttl_ms.
"""

from __future__ import annotations

import threading

from sdcp_fast.protocol import Action, SessionOpen, StaleBase, Verdict
from sdcp_fast.protocol.messages import ROLE_DRAFTER, ROLE_VERIFIER, RULE_GREEDY
from sdcp_fast.protocol.session import State, VerifierSession
from sdcp_fast.roles.router import SessionSpec
from tests.roles.rolekit import (
    DRAFTER,
    OTHER,
    PROMPT,
    TARGET,
    VERIFIER,
    VERIFIER_PEER,
    CountingScorer,
    assignment,
    contract,
    proposal,
    run,
    session_open,
    sid,
    until,
)
from tests.roles.test_router import RouterRig

S = sid(71)
SELF_DECODING = dict(fallback=(int(Action.SELF_DECODE),), low_rounds=1, self_load=100, self_max=None)


def test_a_drafter_assigned_during_a_self_decoded_round_is_not_answered_its_verdict():
    """The router's assignment carries the state the verifier answered to PUT drafter: while a
    self-decoded round is in progress, the round before it. The drafter's first proposal then
    names the self-decoded round; its verdict (self_decode, addressed to nobody) must not be
    that drafter's answer: it is told where the session stands (sdcp-stale-base) instead."""
    c = contract(RULE_GREEDY, max_new=16, **SELF_DECODING)
    opened: SessionOpen = session_open(S, c)
    session, state = VerifierSession.open(opened, target_digest=TARGET, vocab=CountingScorer().vocab_size)
    assert session.begin_self_decoding(load=0)
    session.self_decode()  # round 1, self-decoded, being scored
    answered = session.assign(assignment(opened, state, drafter=DRAFTER))
    session.complete_scoring(0, 7)
    session.append_done(ok=True)
    assert session.state is State.READY and session.drafter == DRAFTER and answered.round == 0
    first = proposal(answered, [1, 2])  # round 1, on the base the assignment carried
    try:
        got = session.receive_proposal(first, client=DRAFTER, now=0.0)
    except StaleBase as problem:
        assert problem.extra["session_state"]["round"] == 1
    else:
        raise AssertionError(f"answered {got}" if isinstance(got, Verdict) else got)
    # On the state it was told, the drafter's proposal is verified.
    then = proposal(session.session_state(), [1])
    assert session.receive_proposal(then, client=DRAFTER, now=0.0).round == 2


class Gated(CountingScorer):
    """Scores the first ``free`` passes at once, then each only once ``go`` is set (off the
    event loop: the verifier offloads its passes), so a self-decoded round stays in progress."""

    def __init__(self, free: int) -> None:
        super().__init__()
        self.free = free
        self.go = threading.Event()

    def score(self, batch):
        if self.free > 0:
            self.free -= 1
        else:
            self.go.wait(30)
        return super().score(batch)


def test_a_told_to_stop_drafter_that_expires_leaves_the_self_decoding_session_alone(tmp_path):
    """The ladder chose self_decode: the verifier decodes the session and its drafter was told
    to stop. That drafter's expiry must not bring another drafter in (which would end the
    self-decoding, and the used-up ladder would fail the session at its next low rounds)."""
    scorer = Gated(free=1)

    async def scenario():
        async with RouterRig(str(tmp_path), scorer=scorer, offload=True) as rig:
            router = rig.router_role
            await rig.report(rig.client(VERIFIER_PEER), VERIFIER, ROLE_VERIFIER)
            await rig.report(rig.drafter, DRAFTER, ROLE_DRAFTER)
            await rig.report(rig.other, OTHER, ROLE_DRAFTER, load=10)
            routed = await router.open(SessionSpec(PROMPT, session=S, max_new=32, **SELF_DECODING))
            assert routed.drafter == DRAFTER
            [given] = rig.stubs[DRAFTER].assignments
            right = rig.greedy_after(given, 1)[0]
            verdict = await rig.drafter.propose(VERIFIER, proposal(given, [(right + 1) % scorer.vocab_size]))
            assert verdict.action == Action.SELF_DECODE
            live = rig.verifier.sessions.get(S)
            await until(lambda: live.state is State.SCORING)  # a self-decoded round, held in the scorer
            rig.clock.advance(11.0)  # DRAFTER's status (ttl 10 s) expires; the others report again
            await rig.report(rig.client(VERIFIER_PEER), VERIFIER, ROLE_VERIFIER)
            await rig.report(rig.other, OTHER, ROLE_DRAFTER, load=10)
            await router.sweep()
            result = (list(rig.stubs[OTHER].assignments), live.drafter, live.revoked, routed.watch.self_decoding)
            scorer.go.set()
            return result

    others, drafter, revoked, self_decoding = run(scenario())
    assert others == [] and drafter == DRAFTER and revoked and self_decoding


def test_the_watchdog_gives_a_session_that_commits_nothing_a_drafter_again(tmp_path):
    """A drafter that holds the assignment, stays live and never proposes (as one whose run
    ended without a word): after three of its ttl_ms without a commit the router asks the
    verifier where the session stands and assigns another drafter; with none other live, the
    same one again (a new assignment restarts it from the verifier's state)."""

    async def scenario():
        async with RouterRig(str(tmp_path)) as rig:
            router = rig.router_role

            async def everyone_reports(*drafters):
                await rig.report(rig.client(VERIFIER_PEER), VERIFIER, ROLE_VERIFIER)
                for client, uri in drafters:
                    await rig.report(client, uri, ROLE_DRAFTER)

            await everyone_reports((rig.drafter, DRAFTER))
            await router.open(SessionSpec(PROMPT, session=S))
            seen = []
            for drafters in [((rig.drafter, DRAFTER),)] * 4 + [((rig.drafter, DRAFTER), (rig.other, OTHER))] * 4:
                rig.clock.advance(8.0)  # the watchdog looks after 30 s without a commit (3 x ttl 10 s)
                await everyone_reports(*drafters)
                await router.sweep()
                seen.append((len(rig.stubs[DRAFTER].assignments), len(rig.stubs[OTHER].assignments)))
            return seen, rig.verifier.sessions.get(S).drafter

    seen, at_verifier = run(scenario())
    # Alone, DRAFTER is assigned again after 32 s; with OTHER live, OTHER 32 s later.
    assert seen == [(1, 0), (1, 0), (1, 0), (2, 0), (2, 0), (2, 0), (2, 0), (2, 1)]
    assert at_verifier == OTHER
