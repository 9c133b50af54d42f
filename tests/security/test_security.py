"""docs/security.md, "Threat model": each claim about who can do what, tested where the claim
is enforced. SDCP roles over real HTTP/2 + TLS 1.3 with client certificates (loopback); the
MLC's policy and name checks directly."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from sdcp_fast.cache import object_uri
from sdcp_fast.cache.index import Head
from sdcp_fast.cache.policy import may_delete, may_lease, may_put, may_read
from sdcp_fast.cache.uri import served_name
from sdcp_fast.model.toy import ToyTarget
from sdcp_fast.protocol import SdcpProblem
from sdcp_fast.protocol.peer import Peer, PeerRole
from sdcp_fast.protocol.problems import Forbidden
from sdcp_fast.roles.verifier import VerifierConfig, VerifierRole
from sdcp_fast.roles.wire import SdcpClient
from sdcp_fast.store import embedded
from sdcp_fast.transport.errors import TransportError
from sdcp_fast.transport.h2client import H2Transport
from sdcp_fast.transport.h2server import serve
from sdcp_fast.transport.inprocess import InProcessNetwork
from sdcp_fast.transport.tls import client_context, server_context
from tests.roles.rolekit import SCOPE, TARGET, assignment, contract, greedy, proposal, session_open, sid

from .conftest import DRAFTER_A, DRAFTER_B, ROUTER, VERIFIER, Certs


@asynccontextmanager
async def served_verifier(certs: Certs, root: str) -> AsyncIterator[tuple[str, VerifierRole]]:
    """A verifier role on loopback behind mutual TLS (its CA: the deployment's)."""
    mlc = embedded(root)
    target = ToyTarget()
    config = VerifierConfig(uri=VERIFIER, target_digest=TARGET, backend="reference", batch_wait=0.0, output_wait=0.05)
    role = VerifierRole(target, config, mlc=mlc, transport=InProcessNetwork().transport(None))
    await role.start()
    server = await serve(role.handler, "127.0.0.1", 0, ssl=server_context(*certs.files("verifier")))
    try:
        async with server:
            yield f"https://127.0.0.1:{server.port}/", role
    finally:
        await role.close()
        mlc.close()


def as_(certs: Certs, name: str) -> SdcpClient:
    return SdcpClient(H2Transport(client_context(*certs.files(name)), timeout=10))


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 60))


def test_no_request_is_served_without_a_verified_client_certificate(certs: Certs, foreign: Certs, tmp_path) -> None:
    """§5.1 mutual authentication: no certificate, or one from another CA, gets no answer at
    all (the handshake fails); the deployment's router certificate is served."""
    import ssl

    async def scenario() -> tuple[list[str], int]:
        async with served_verifier(certs, str(tmp_path)) as (url, _):
            refused = []
            bare = ssl.create_default_context(cafile=certs.files("router")[2])
            bare.set_alpn_protocols(["h2"])
            foreign_ctx = client_context(*foreign.files("router")[:2], certs.files("router")[2])
            for ctx in (bare, foreign_ctx):
                async with H2Transport(ctx, timeout=10) as t:
                    try:
                        await t.request(url, "GET", "health")
                    except TransportError as exc:
                        refused.append(type(exc).__name__)
            router = as_(certs, "router")
            state = await router.open_session(url, session_open(sid(1), contract()))
            await router.transport.close()
            return refused, state.round

    refused, round_ = run(scenario())
    assert len(refused) == 2 and round_ == 0


def test_insecure_serving_is_refused_off_loopback() -> None:
    """--insecure (h2c, nobody authenticated) binds loopback only."""
    async def scenario() -> None:
        await serve(lambda r: None, "0.0.0.0", 0, ssl=None, insecure=True)  # type: ignore[arg-type,return-value]

    with pytest.raises(ValueError):
        run(scenario())


def test_a_drafter_certificate_cannot_act_as_a_router(certs: Certs, tmp_path) -> None:
    """Roles come from the certificate: a drafter's cannot open sessions, assign drafters or
    change a policy (403 sdcp-forbidden), whatever its body says."""
    async def scenario() -> list[tuple[str, int]]:
        async with served_verifier(certs, str(tmp_path)) as (url, _):
            router, drafter = as_(certs, "router"), as_(certs, "drafter-a")
            opened = session_open(sid(2), contract())
            state = await router.open_session(url, opened)
            answers = []
            from sdcp_fast.protocol import Policy, Sampling

            for call in (lambda: drafter.open_session(url, session_open(sid(3), contract())),
                         lambda: drafter.put_drafter(url, assignment(opened, state, drafter=DRAFTER_A)),
                         lambda: drafter.policy(url, Policy(session=sid(2), from_round=5,
                                                            sampling=Sampling(temperature_milli=0)))):
                try:
                    await call()
                    answers.append(("served", 200))
                except SdcpProblem as problem:
                    answers.append((problem.suffix, problem.status))
            for client in (router, drafter):
                await client.transport.close()
            return answers

    assert run(scenario()) == [("sdcp-forbidden", 403)] * 3


def test_drafter_and_verifier_certificates_cannot_act_as_each_other_at_the_router(tmp_path) -> None:
    """At the router: a drafter cannot send events (a verifier's), nor report as a verifier; a
    verifier cannot report as another instance."""
    from sdcp_fast.protocol import Action, Event, Status
    from sdcp_fast.protocol.messages import ROLE_DRAFTER, ROLE_VERIFIER
    from sdcp_fast.roles.router import RouterRole

    async def scenario() -> list[str]:
        network = InProcessNetwork()
        with embedded(str(tmp_path)) as mlc:
            router = RouterRole(uri=ROUTER, mlc=mlc, transport=network.transport(None), target_digest=TARGET,
                                tokenizer_digest=TARGET, drafter_models={})
            network.register(ROUTER, router.handler)
            drafter = SdcpClient(network.transport(Peer(DRAFTER_A, PeerRole.DRAFTER)))
            verifier = SdcpClient(network.transport(Peer(VERIFIER, PeerRole.VERIFIER)))
            out = []
            for call in (
                lambda: drafter.event(ROUTER, Event(session=sid(4), epoch=1, kind=Action.SWITCH, committed=0,
                                                    digest=bytes(32))),
                lambda: drafter.status(ROUTER, Status(instance=DRAFTER_A, role=ROLE_VERIFIER, load=0, queue=0,
                                                      ttl_ms=1000)),
                lambda: verifier.status(ROUTER, Status(instance=DRAFTER_B, role=ROLE_DRAFTER, load=0, queue=0,
                                                       ttl_ms=1000)),
            ):
                try:
                    await call()
                    out.append("served")
                except SdcpProblem as problem:
                    out.append(problem.suffix)
            return out

    assert run(scenario()) == ["sdcp-forbidden"] * 3


def test_a_drafter_cannot_propose_for_a_session_it_is_not_assigned(certs: Certs, tmp_path) -> None:
    """§6.3: the authenticated identity, not the proposal's ``drafter`` member, is compared
    with the assignment: drafter-b naming drafter-a in its body is still 403 sdcp-not-assigned,
    and nothing is committed; drafter-a's own proposal is verified."""
    async def scenario() -> tuple[str, int, int]:
        async with served_verifier(certs, str(tmp_path)) as (url, role):
            router, a, b = as_(certs, "router"), as_(certs, "drafter-a"), as_(certs, "drafter-b")
            opened = session_open(sid(5), contract())
            state = await router.open_session(url, opened)
            state = await router.put_drafter(url, assignment(opened, state, drafter=DRAFTER_A))
            tokens = greedy(ToyTarget(), opened.prompt, 2)
            try:
                await b.propose(url, proposal(state, tokens, drafter=DRAFTER_A))
                refused = "served"
            except SdcpProblem as problem:
                refused = problem.suffix
            committed_after_refusal = len(role.sessions.get(sid(5)).output(0).tokens)
            verdict = await a.propose(url, proposal(state, tokens, drafter=DRAFTER_A))
            for client in (router, a, b):
                await client.transport.close()
            return refused, committed_after_refusal, verdict.committed

    refused, before, after = run(scenario())
    assert refused == "sdcp-not-assigned" and before == 0 and after >= 2


# -- MLC ----------------------------------------------------------------------------------

ESCAPES = ["mlc://../../etc/passwd", f"mlc://{SCOPE.hex()}/../q_rows/1", f"mlc://{SCOPE.hex()}/a/../../q_rows",
           f"mlc://{SCOPE.hex()}/..%2f..%2fetc/q_rows/1", f"mlc://{SCOPE.hex()}/s/q_rows/1/../../x",
           f"mlc://{SCOPE.hex()}//q_rows/1", f"mlc://{SCOPE.hex()}/s\x00/q_rows/1", "file:///etc/passwd",
           f"mlc://{SCOPE.hex()}/s/../../../../tmp/x", "/etc/passwd", f"mlc://{SCOPE.hex()}/s/evil_kind/1"]


@pytest.mark.parametrize("name", ESCAPES)
def test_mlc_names_cannot_escape_the_storage_root(name: str) -> None:
    """Only mlc://<scope-hex32>/<base64url session>/<known kind>[/<decimal round>] is served:
    no dots, no empty or encoded segments, no other scheme (a 400 before anything is stored)."""
    with pytest.raises(ValueError):
        served_name(name)


def test_mlc_disk_paths_stay_under_the_root(tmp_path) -> None:
    """The file commit logs map every name, hostile ones included, to a file under their root
    (a digest of the name, never the name's path segments)."""
    from sdcp_fast.commitlog.file import log_path

    root = tmp_path / "root"
    names = [object_uri(SCOPE, name, "commit_log") for name in ("s", "AAAA", "a-b_c")]
    for name in [*names, *ESCAPES, "mlc://../../tmp/evil", "mlc:///etc/passwd", "mlc://%2e%2e/x"]:
        path = log_path(str(root), name)
        assert str(path).startswith(str(root) + "/") and ".." not in str(path), path


def test_a_remote_router_cannot_name_a_file_commit_log(certs: Certs, tmp_path) -> None:
    """A commit_log on the verifier's own file system is not a remote peer's to name: 400,
    and no file is created."""
    target = tmp_path / "not-yours.log"

    async def scenario() -> tuple[str, int]:
        async with served_verifier(certs, str(tmp_path / "mlc")) as (url, _):
            router = as_(certs, "router")
            opened = session_open(sid(7), contract())
            from dataclasses import replace

            try:
                await router.open_session(url, replace(opened, commit_log=f"file://{target}"))
                answer = ("served", 200)
            except SdcpProblem as problem:
                answer = (problem.suffix, problem.status)
            await router.transport.close()
            return answer

    assert run(scenario()) == ("sdcp-bad-request", 400)
    assert not target.exists()


def test_one_drafter_cannot_touch_another_drafters_objects_nor_read_target_kv() -> None:
    """docs/security.md, MLC: objects belong to their writer. Drafter b cannot overwrite,
    delete or lease drafter a's q rows; a drafter cannot read target_kv (the verifier's) and a
    client cannot read q rows; a router may do everything (clean-up after fail-over)."""
    a, b = Peer(DRAFTER_A, PeerRole.DRAFTER), Peer(DRAFTER_B, PeerRole.DRAFTER)
    client, router = Peer(None, PeerRole.CLIENT), Peer(ROUTER, PeerRole.ROUTER)
    q = served_name(object_uri(SCOPE, sid(6), "q_rows", 1))
    kv = served_name(object_uri(SCOPE, sid(6), "target_kv"))
    head_a = Head(size=4, etag="e", tier="host", leased=False, meta={}, owner=DRAFTER_A)
    head_v = Head(size=4, etag="e", tier="host", leased=False, meta={}, owner=VERIFIER)
    for check in (may_put(b, q), may_delete(b, q), may_lease(b, q)):
        assert check is not None
        with pytest.raises(Forbidden):
            check(head_a)
    for peer, name, head in ((a, kv, head_v), (client, q, head_a)):
        check = may_read(peer, name)
        assert check is not None
        with pytest.raises(Forbidden):
            check(head)
    with pytest.raises(Forbidden):
        may_put(a, kv)  # a drafter cannot create a verifier's kind
    for check in (may_put(a, q), may_delete(a, q), may_lease(a, q)):  # the owner may
        assert check is None or check(head_a) is None
    for check in (may_put(router, q), may_delete(router, q), may_read(router, kv), may_lease(router, q)):
        assert check is None or check(head_a) is None
