"""The router's fail-over (roles/router_recovery.py, §6.9) over real verifiers: what the
resumed verifier is told to read when a fail-over follows one whose verifier committed nothing."""

from __future__ import annotations

from sdcp_fast.cache import object_uri
from sdcp_fast.cache.uri import writer_tag
from sdcp_fast.protocol import Sampling
from sdcp_fast.protocol.commitlog import CommitRecord
from sdcp_fast.protocol.messages import RULE_SPECULATIVE
from sdcp_fast.roles.router import SessionSpec

from .rolekit import (
    DRAFTER,
    PROMPT,
    SCOPE,
    STANDBY,
    VERIFIER,
    Failover,
    run,
    sid,
    until,
)

THIRD = "inproc://third/"
S = sid(41)


def test_a_second_failover_resumes_from_the_last_commit_records_epoch(tmp_path):
    """Epoch 1's verifier commits rounds and goes silent together with the only drafter;
    epoch 2's verifier gets the session but, with no drafter, commits nothing before it goes
    silent too. The epoch-3 resume names the committed output of epoch 1, where the last
    commit record was written, by its writer: epoch 2 wrote no output object."""
    parts = Failover(str(tmp_path))
    clock, network, mlc = parts.clock, parts.network, parts.mlc
    killed, kill_after_round_3 = parts.partition_after(VERIFIER, 3)

    async def scenario():
        router = parts.router()
        first, middle, third = parts.verifier(VERIFIER, kill_after_round_3), parts.verifier(STANDBY), parts.verifier(THIRD)
        drafter = parts.drafter()
        roles = [first, drafter, middle, third]
        for role in roles[:2]:
            await role.start()
        try:
            await until(lambda: router.table.status(DRAFTER, clock()) is not None)
            spec = SessionSpec(PROMPT, max_new=40, rule=RULE_SPECULATIVE, session=S,
                               sampling=Sampling(temperature_milli=1000, seed=76))
            await router.open(spec)
            await until(lambda: killed)
            for role in (first, drafter):  # the only drafter dies with the first verifier
                await role.close()
            network.unregister(DRAFTER)
            clock.advance(11.0)  # both statuses expire
            await middle.start()
            await middle.report_status()
            await router.sweep()
            at_middle = router.sessions[S]
            moved = (at_middle.verifier, at_middle.epoch)
            clock.advance(11.0)
            await middle.close()  # silent too, having committed nothing
            network.unregister(STANDBY)
            await third.start()
            await third.report_status()
            await router.sweep()
            routed = router.sessions[S]
            opened = routed.opened
            at_third = third.sessions.get(S)
            return moved, routed, opened, at_third.committed if at_third is not None else None
        finally:
            for role in roles:
                await role.close()

    try:
        moved, routed, opened, committed_at_third = run(scenario(), timeout=30.0)
        records = mlc.logs.log(object_uri(SCOPE, S, "commit_log")).read().records
    finally:
        mlc.close()
    assert moved == (STANDBY, 2)
    last = [r for r in records if isinstance(r, CommitRecord)][-1]
    assert last.epoch == 1 and routed.verifier == THIRD and routed.epoch == 3
    assert opened is not None and opened.epoch == 3 and opened.resume is not None
    assert opened.resume.committed == last.committed and opened.resume.round == last.round
    assert opened.resume.committed_tokens == object_uri(SCOPE, S, "committed_tokens", 1, tag=writer_tag(VERIFIER))
    assert committed_at_third == last.committed
