"""Names nobody can squat (docs/security.md, "Names nobody can squat"): a q-row name carries its
writer's tag (cache/uri.writer_tag), and the MLC lets only that writer create it, so another
drafter can neither take the name first (and have the owner's PUT refused) nor have its bytes
scored as the owner's; the verifier takes no rows tagged for another drafter than the one
proposing. A committed_tokens object is named for the verifier of its epoch, as the router
opened the session there: a standby cannot create the next epoch's first."""

from __future__ import annotations

import pytest

from sdcp_fast.cache import MLC, object_uri
from sdcp_fast.cache.tiers.host import HostTier
from sdcp_fast.cache.uri import writer_tag
from sdcp_fast.protocol import SdcpProblem
from sdcp_fast.protocol.messages import ROLE_DRAFTER, ROLE_VERIFIER, RULE_SPECULATIVE
from sdcp_fast.protocol.problems import Forbidden
from sdcp_fast.roles.router import SessionSpec
from sdcp_fast.transport.tls import client_context, server_context
from tests.mlc_server.serverkit import ALPN, serving
from tests.roles.rolekit import (
    DRAFTER,
    OTHER,
    PROMPT,
    SCOPE,
    VERIFIER,
    VERIFIER_PEER,
    Rig,
    contract,
    proposal,
    run,
    sid,
)
from tests.roles.test_router import RouterRig
from tests.store.certkit import make_certs

A, B = "https://drafter-a.test:8443/", "https://drafter-b.test:8443/"  # certkit's "client" and "drafter2"
S = sid(81)


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return make_certs(tmp_path_factory.mktemp("certs"))


def test_another_drafter_cannot_take_a_drafters_q_row_name(certs) -> None:
    rows = object_uri(SCOPE, S, "q_rows", 7, tag=writer_tag(A))
    ctx = server_context(certs["server_cert"], certs["server_key"], certs["ca"], alpn=(ALPN["h2"],))
    with MLC([HostTier(1 << 20)]) as mlc, serving(mlc, ctx, http2=True) as base:
        a = base.client(ssl=client_context(certs["client_cert"], certs["client_key"], certs["ca"]))
        b = base.client(ssl=client_context(certs["drafter2_cert"], certs["drafter2_key"], certs["ca"]))
        try:
            with pytest.raises(Forbidden):
                b.put(rows, b"b's rows under a's name")
            a.put(rows, b"a's rows")
            b.put(object_uri(SCOPE, S, "q_rows", 7, tag=writer_tag(B)), b"b's own rows")
            assert bytes(mlc.get(rows)) == b"a's rows" and mlc.head(rows).owner == A
        finally:
            a.close()
            b.close()


def test_the_verifier_takes_no_rows_tagged_for_another_drafter(tmp_path) -> None:
    """DRAFTER proposes with rows tagged for OTHER (whoever wrote them): the round gets
    sdcp-q-unavailable and commits nothing; its own rows are taken."""

    async def scenario():
        async with Rig(str(tmp_path)) as rig:
            c = contract(RULE_SPECULATIVE)
            opened, state = await rig.open(S, c)
            import torch

            uniform = torch.full((1, rig.scorer.vocab_size), 1.0 / rig.scorer.vocab_size)
            theirs = object_uri(SCOPE, S, "q_rows", 1, tag=writer_tag(OTHER))
            ours = object_uri(SCOPE, S, "q_rows", 1, tag=writer_tag(DRAFTER))
            rig.mlc.put(theirs, uniform.contiguous())
            rig.mlc.put(ours, uniform.contiguous())
            try:
                await rig.drafter.propose(VERIFIER, proposal(state, [3], q_rows=theirs))
                refused = None
            except SdcpProblem as problem:
                refused = problem.suffix
            verdict = await rig.drafter.propose(VERIFIER, proposal(state, [3], q_rows=ours))
            return refused, verdict.round

    refused, round_ = run(scenario())
    assert refused == "sdcp-q-unavailable" and round_ == 1


def test_a_standby_verifier_cannot_take_the_next_epochs_committed_tokens(certs) -> None:
    epoch_2 = "https://verifier-2.test:8443/"  # the verifier the router opens epoch 2 at
    theirs = object_uri(SCOPE, S, "committed_tokens", 2, tag=writer_tag(epoch_2))
    ctx = server_context(certs["server_cert"], certs["server_key"], certs["ca"], alpn=(ALPN["h2"],))
    with MLC([HostTier(1 << 20)]) as mlc, serving(mlc, ctx, http2=True) as base:
        standby = base.client(ssl=client_context(certs["verifier_cert"], certs["verifier_key"], certs["ca"]))
        try:
            with pytest.raises(Forbidden):
                standby.put(theirs, b"\0\0\0\0")
            own = object_uri(SCOPE, S, "committed_tokens", 2, tag=writer_tag("https://verifier.test:8443/"))
            standby.put(own, b"\0\0\0\0")
            assert not mlc.contains(theirs) and mlc.contains(own)
        finally:
            standby.close()


def test_the_router_names_each_epochs_committed_tokens_for_its_verifier(tmp_path) -> None:
    """The assignment carries committed_tokens/<epoch>.<tag of the epoch's verifier>, and that
    verifier writes its output exactly there."""

    async def scenario():
        async with RouterRig(str(tmp_path)) as rig:
            await rig.report(rig.client(VERIFIER_PEER), VERIFIER, ROLE_VERIFIER)
            await rig.report(rig.drafter, DRAFTER, ROLE_DRAFTER)
            routed = await rig.router_role.open(SessionSpec(PROMPT, session=S))
            [given] = rig.stubs[DRAFTER].assignments
            return routed.committed_tokens, given.committed_tokens, rig.verifier.live(S).log.tokens_ref

    named, carried, written = run(scenario())
    assert named == carried == written == object_uri(SCOPE, S, "committed_tokens", 1, tag=writer_tag(VERIFIER))
