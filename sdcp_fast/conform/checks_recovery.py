"""§6.8 and §6.9 as the router runs a fail-over: the kit fences the session's commit log,
re-opens the session at the next epoch with ``resume``, assigns its drafter again, and checks
that the old epoch can neither commit, nor re-open, nor assign, nor propose.

Fencing needs the commit log's store (adapters.py: ``fence``), and resume a cache that serves
the committed tokens (``put``); without them those checks are not reachable and the session is
re-opened afresh (§6.9 "afresh when nothing was committed" is the router's other choice).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sdcp_fast.conform.driver import Scripted, learn_greedy
from sdcp_fast.protocol import Output, Resume, SessionState

if TYPE_CHECKING:
    from sdcp_fast.conform.checker import Checker

OTHER_DRAFTER = "https://another-drafter.invalid/"


async def recovery(kit: Checker) -> None:
    r = kit.report
    greedy = await learn_greedy(kit)
    s = await Scripted(kit, kit.contract(max_new=40), greedy).open()
    for m in (2, 3):
        if await s.round(s.next_greedy(m)) is None:
            return
    assert s.opened is not None and s.state is not None
    old_open, last = s.opened, s.state
    fenced = False
    if kit.store.fence_supported:
        try:
            await kit.store.fence(old_open.commit_log, old_open.epoch + 1)
            fenced = True
        except Exception as exc:  # the store is the deployment's: say what it answered
            r.add("fenced", None, f"the store refused the kit's fence record: {type(exc).__name__}: {exc}")
    if fenced:
        answers = [await s.send(s.next_greedy(2)) for _ in range(2)]
        out = await kit.output(s.session, 0)
        # Output of the fenced epoch: nothing beyond what was committed before the fence (or
        # nothing at all: the verifier stopped serving the session).
        released = Output.decode(out.body).tokens if out.status == 200 else ()
        ok = all(a.status != 200 for a in answers) and list(released) in ([], s.committed)
        r.add("fenced", ok, f"proposals after the fence {[a.brief() for a in answers]}; output {out.brief()} "
              f"with {len(released)} tokens ({len(s.committed)} committed before the fence)")
    elif not kit.store.fence_supported:
        r.add("fenced", None, "needs the commit log's store (--mlc or --store with fence)")
    # Re-open at epoch 2, resuming from the last verdict when the cache can hold the tokens.
    resume = None
    if kit.can_put:
        ref = await kit.store.put(kit.scope, s.session, "committed_tokens", 1, kit.store.tokens(s.committed))
        resume = Resume(round=last.round, committed=last.committed, digest=last.digest, committed_tokens=ref)
    reopened = kit.session_open(old_open.contract, session=s.session, epoch=2, resume=resume)
    answer = await kit.post_session(reopened)
    if answer.status != 200:
        r.add("resume", False, f"a session-open at epoch 2 {answer.brief()}")
        return
    state = SessionState.decode(answer.body)
    if resume is not None:
        r.add("resume", (state.epoch, state.round, state.committed, state.digest)
              == (2, last.round, last.committed, last.digest), f"epoch {state.epoch}, round {state.round}, "
              f"committed {state.committed}")
    else:
        r.add("resume", None, "needs a cache for committed_tokens (--mlc or --store)")
        s.committed = []
    s.opened = reopened
    s.state = await kit.assign(reopened, state)
    v = await s.round(s.next_greedy(2))
    r.add("resume", v is not None, "a proposal at the new epoch")
    if v is None:
        return
    kit.refused("old-epoch-proposal", await s.send(s.next_greedy(1), epoch=1), 409, "sdcp-stale-epoch")
    kit.refused("lower-epoch-open", await kit.post_session(old_open), 409, "sdcp-stale-epoch")
    stale = kit.assignment(reopened, v, OTHER_DRAFTER, epoch=1)
    answer = await kit.put_drafter(reopened, stale)
    after = await s.round(s.next_greedy(1))
    r.add("assignment-stale-epoch", 400 <= answer.status < 500 and after is not None,
          f"an epoch-1 assignment {answer.brief()}; the assigned drafter then "
          + ("proposed" if after is not None else "was refused"))
    r.add("lower-epoch-open", after is not None and after.epoch == 2, "the session stayed at epoch 2")
    # Drafter fail-over: another drafter is assigned; the kit's proposals are no longer taken.
    assert s.state is not None
    await kit.assign(reopened, s.state, OTHER_DRAFTER)
    answer = await s.send(s.next_greedy(1))
    kit.refused("drafter-failover", answer, 403, "sdcp-not-assigned")
