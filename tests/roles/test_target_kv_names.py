"""Target KV page names nobody can squat (docs/security.md, "Names nobody can squat"): a
verifier publishes ``target_kv/<epoch>.<its tag>``, a fail-over names only the pages of the
verifier its epoch was opened at, and a resume takes no pages whose name carries no tag."""

from __future__ import annotations

import time
from typing import Any

import pytest

from sdcp_fast.cache import object_uri
from sdcp_fast.cache.uri import writer_tag
from sdcp_fast.protocol import SessionOpen
from sdcp_fast.protocol.messages import ROLE_DRAFTER, ROLE_VERIFIER
from sdcp_fast.protocol.peer import Peer, PeerRole
from sdcp_fast.roles.load import VerifierLoad
from sdcp_fast.roles.metrics import VerifierMetrics
from sdcp_fast.roles.objects import Objects
from sdcp_fast.roles.router import SessionSpec
from sdcp_fast.roles.verifier import VerifierRole
from sdcp_fast.roles.verifier_config import VerifierContext
from sdcp_fast.roles.verifier_kv import KvPublisher
from sdcp_fast.roles.verifier_state import Background
from sdcp_fast.transport.base import Request, Response

from .rolekit import (
    DRAFTER,
    PROMPT,
    SCOPE,
    STANDBY,
    TARGET,
    VERIFIER,
    VERIFIER_PEER,
    proposal,
    run,
    sid,
    verifier_config,
)
from .test_router import RouterRig

S = sid(91)


def test_a_verifier_publishes_its_pages_under_its_own_tag(tmp_path) -> None:
    async def scenario():
        async with RouterRig(str(tmp_path)) as rig:
            await rig.report(rig.client(VERIFIER_PEER), VERIFIER, ROLE_VERIFIER)
            await rig.report(rig.drafter, DRAFTER, ROLE_DRAFTER)
            await rig.router_role.open(SessionSpec(PROMPT, session=S))
            return rig.verifier.live(S).kv.ref

    assert run(scenario()) == object_uri(SCOPE, S, "target_kv", 1, tag=writer_tag(VERIFIER))


@pytest.mark.parametrize("rightful", [False, True])
def test_a_fail_over_names_only_the_pages_of_the_epochs_verifier(tmp_path, rightful: bool) -> None:
    """The standby created epoch 1's pages first, untagged and under its own tag: neither is
    named to the verifier that takes over; the pages of epoch 1's verifier are, once there."""
    opens: list[SessionOpen] = []

    async def scenario():
        async with RouterRig(str(tmp_path)) as rig:
            standby = VerifierRole(rig.scorer, verifier_config(uri=STANDBY), mlc=rig.store,
                                   transport=rig.network.transport(Peer(STANDBY, PeerRole.VERIFIER)))

            async def recording(request: Request) -> Response:
                if request.method == "POST" and request.path.endswith("sessions"):
                    opens.append(SessionOpen.decode(request.body))
                return await standby.handler(request)

            rig.network.register(STANDBY, recording)
            await standby.start()
            try:
                await rig.report(rig.client(VERIFIER_PEER), VERIFIER, ROLE_VERIFIER)
                await rig.report(rig.drafter, DRAFTER, ROLE_DRAFTER)
                await rig.router_role.open(SessionSpec(PROMPT, session=S))
                state = await rig.router.open_session(VERIFIER, rig.router_role.sessions[S].opened)
                await rig.drafter.propose(VERIFIER, proposal(state, rig.greedy_after(state, 2)))  # epoch 1 commits
                rig.mlc.put(object_uri(SCOPE, S, "target_kv", 1), b"squatted")
                rig.mlc.put(object_uri(SCOPE, S, "target_kv", 1, tag=writer_tag(STANDBY)), b"squatted")
                if rightful:
                    rig.mlc.put(object_uri(SCOPE, S, "target_kv", 1, tag=writer_tag(VERIFIER)), b"epoch 1's")
                rig.clock.advance(11.0)  # the active verifier's status expires; the standby's is fresh
                await rig.report(rig.client(Peer(STANDBY, PeerRole.VERIFIER)), STANDBY, ROLE_VERIFIER)
                await rig.report(rig.drafter, DRAFTER, ROLE_DRAFTER)
                await rig.router_role.sweep()
                return rig.router_role.sessions[S]
            finally:
                await standby.close()

    routed = run(scenario())
    assert routed.verifier == STANDBY and routed.epoch == 2
    [resumed] = [o for o in opens if o.epoch == 2]
    assert resumed.resume is not None
    expected = object_uri(SCOPE, S, "target_kv", 1, tag=writer_tag(VERIFIER)) if rightful else None
    assert resumed.resume.target_kv == expected


class _Pages:
    """A scorer's pages adapter that records what it is asked to import."""

    def __init__(self) -> None:
        self.imported: list[Any] = []

    def decode_kv(self, data: Any) -> Any:
        return bytes(data)

    def import_kv(self, session: bytes, pages: Any, committed: Any) -> int:
        self.imported.append(pages)
        return 3


def test_a_resume_takes_no_pages_whose_name_carries_no_tag(tmp_path) -> None:
    from sdcp_fast.store import embedded

    from .rolekit import contract, session_open

    store = embedded(str(tmp_path))
    pages = _Pages()

    async def scenario() -> tuple[list[Any], int, int]:
        from sdcp_fast.protocol.session import VerifierSession
        from sdcp_fast.roles.verifier_state import LiveSession, SessionLog

        metrics = VerifierMetrics()
        context = VerifierContext(store=store, objects=Objects(store), load=VerifierLoad(1), metrics=metrics,
                                  background=Background(), clock=time.monotonic)
        config = verifier_config(kv_publish_tokens=1, kv_publish_growth=0.0)
        kv = KvPublisher(pages, config, context)  # type: ignore[arg-type]
        untagged = object_uri(SCOPE, S, "target_kv", 1)
        tagged = object_uri(SCOPE, S, "target_kv", 1, tag=writer_tag(VERIFIER))
        await store.put(untagged, b"anybody's")
        await store.put(tagged, b"epoch 1's")
        session, _ = VerifierSession.open(session_open(S, contract()), target_digest=TARGET)
        fed = []
        for ref in (untagged, tagged):
            live = LiveSession(session, SessionLog(None, "", None))  # type: ignore[arg-type]
            await kv.resume(live, ref)
            fed.append(live.prefill.fed)
        refused = metrics.registry.get_sample_value("sdcp_resumes_total", {"kv": "cold", "reason": "refused"})
        kv.close()
        return fed, int(refused or 0), len(pages.imported)

    try:
        fed, refused, imported = run(scenario())
    finally:
        store.close()
    assert fed == [0, 3] and refused == 1 and imported == 1
