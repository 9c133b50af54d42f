"""Names nobody can squat (docs/security.md, "Names nobody can squat"): a q-row name carries its
writer's tag (cache/uri.writer_tag), and the MLC lets only that writer create it, so another
drafter can neither take the name first (and have the owner's PUT refused) nor have its bytes
scored as the owner's; the verifier takes no rows tagged for another drafter than the one
proposing."""

from __future__ import annotations

import pytest

from sdcp_fast.cache import MLC, object_uri
from sdcp_fast.cache.tiers.host import HostTier
from sdcp_fast.cache.uri import writer_tag
from sdcp_fast.protocol import SdcpProblem
from sdcp_fast.protocol.messages import RULE_SPECULATIVE
from sdcp_fast.protocol.problems import Forbidden
from sdcp_fast.transport.tls import client_context, server_context
from tests.roles.rolekit import DRAFTER, OTHER, SCOPE, VERIFIER, Rig, contract, proposal, run, sid
from tests.store.certkit import make_certs
from tests.store.serverkit import ALPN, serving

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
