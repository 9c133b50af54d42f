"""A router's durable state in etcd (sdcp_fast/cluster/etcd_records.py): with ``records`` and
``commit_logs`` the routing records and the session's commit log are keys of the cluster's
etcd, not objects of the MLC, so a router on another MLC (the first one lost) still adopts
the session, and the committed rounds are read from etcd."""

from __future__ import annotations

import pytest

from sdcp_fast.cache.failures import ObjectUnavailable
from sdcp_fast.cluster.etcd_records import EtcdRecords, commit_log_ref
from sdcp_fast.commitlog.etcd import EtcdCommitLog
from sdcp_fast.protocol import Action
from sdcp_fast.protocol.commitlog import CommitRecord
from sdcp_fast.protocol.messages import ROLE_VERIFIER, RULE_GREEDY
from sdcp_fast.roles.router import RouterRole, SessionSpec
from sdcp_fast.store import embedded
from tests.commitlog.mlc_etcd import running_etcd
from tests.roles.rolekit import (
    DRAFTER,
    PROMPT,
    ROUTER,
    ROUTER_PEER,
    SCOPE,
    TARGET,
    TOKENIZER,
    VERIFIER,
    VERIFIER_PEER,
    Rig,
    run,
    sid,
    status,
    until,
)

pytestmark = pytest.mark.services

S = sid(41)


def test_routing_records_and_commit_logs_live_in_etcd(tmp_path) -> None:
    with running_etcd() as (host, port):
        records = EtcdRecords("c1", [("127.0.0.1", 1), (host, port)])  # a member down: the next one answers

        async def scenario() -> tuple[list[int], Action | None, str, str | None]:
            with pytest.raises(ObjectUnavailable):
                await records.get("mlc://nothing/here")
            async with Rig(str(tmp_path / "a")) as rig:
                router = RouterRole(uri=ROUTER, mlc=rig.store, transport=rig.network.transport(ROUTER_PEER),
                                    target_digest=TARGET, tokenizer_digest=TOKENIZER, scope=SCOPE,
                                    drafter_models={DRAFTER: b"a" * 32}, sweep_interval=0.05, records=records,
                                    commit_logs=lambda scope, session: commit_log_ref("c1", port, scope, session))
                rig.network.register(ROUTER, router.handler)
                await rig.client(VERIFIER_PEER).status(ROUTER, status(VERIFIER, ROLE_VERIFIER))
                await rig.drafter_role(router=ROUTER, fixed_m=3)
                await until(lambda: router.table.live(DRAFTER, router.clock()))
                routed = await router.open(SessionSpec(PROMPT, max_new=12, rule=RULE_GREEDY, session=S))
                tokens, finish = await router.text(S)
                # The MLC is gone: another router on an empty one still finds the session in etcd.
                other = embedded(str(tmp_path / "b"))
                try:
                    again = RouterRole(uri="inproc://router/2/", mlc=other, transport=rig.network.transport(ROUTER_PEER),
                                       target_digest=TARGET, tokenizer_digest=TOKENIZER, scope=SCOPE,
                                       drafter_models={}, records=records)
                    adopted = await again.adopt(S)
                finally:
                    other.close()
                return tokens, finish, routed.commit_log, None if adopted is None else adopted.verifier

        try:
            tokens, finish, ref, adopted_at = run(scenario(), timeout=60)
        finally:
            records.close()
        assert ref == commit_log_ref("c1", port, SCOPE, S) and ref.startswith(f"etcd://127.0.0.1:{port}/sdcp/c1/logs/")
        assert finish == Action.FINISH and len(tokens) == 12
        assert adopted_at == VERIFIER
        log = EtcdCommitLog.from_ref(ref)
        try:
            commits = [r for r in log.read().records if isinstance(r, CommitRecord)]
        finally:
            log.close()
        assert commits and commits[-1].committed == 12
