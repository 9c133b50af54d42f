"""Who may read a session's output, and what an ``--insecure`` service believes
(docs/security.md, "Who reads a session's output" and "--insecure"):

- ``GET sessions/{id}/output`` is the router's: any other certificate of the deployment (a
  drafter's, another verifier's, a client's) is 403 sdcp-forbidden;
- an ``--insecure`` service authenticates nobody, and a request that claims an identity in
  headers (``x-sdcp-peer-role: router``) is still from nobody: 403 wherever a role is needed.
"""

from __future__ import annotations

import asyncio
import json

from sdcp_fast.deploy.service import Security, serve_role
from sdcp_fast.deploy.up import free_port
from sdcp_fast.model.toy import ToyTarget
from sdcp_fast.protocol import SdcpProblem
from sdcp_fast.protocol.messages import MEDIA_TYPE
from sdcp_fast.roles.verifier import VerifierConfig, VerifierRole
from sdcp_fast.store import embedded
from sdcp_fast.transport.h2client import H2Transport
from sdcp_fast.transport.inprocess import InProcessNetwork
from tests.roles.rolekit import TARGET, contract, session_open, sid

from .conftest import ROUTER, VERIFIER, Certs
from .test_security import as_, run, served_verifier

S = sid(61)


def test_only_the_router_reads_a_sessions_output(certs: Certs, tmp_path) -> None:
    async def scenario() -> tuple[dict[str, tuple[int, str]], int]:
        async with served_verifier(certs, str(tmp_path)) as (url, _):
            router = as_(certs, "router")
            await router.open_session(url, session_open(S, contract()))
            refused = {}
            for name in ("drafter-a", "drafter-b", "verifier", "client"):
                client = as_(certs, name)
                try:
                    await client.output(url, S, 0)
                    refused[name] = (200, "")
                except SdcpProblem as problem:
                    refused[name] = (problem.status, problem.suffix)
                await client.transport.close()
            out = await router.output(url, S, 0, timeout=5)
            await router.transport.close()
            return refused, out.epoch

    refused, epoch = run(scenario())
    assert refused == {name: (403, "sdcp-forbidden") for name in ("drafter-a", "drafter-b", "verifier", "client")}
    assert epoch == 1


def test_an_insecure_service_takes_no_identity_from_headers(tmp_path) -> None:
    async def scenario() -> tuple[int, str, int]:
        mlc = embedded(str(tmp_path))
        config = VerifierConfig(uri=VERIFIER, target_digest=TARGET, backend="reference", batch_wait=0.0, output_wait=0.05)
        role = VerifierRole(ToyTarget(), config, mlc=mlc, transport=InProcessNetwork().transport(None))
        port = free_port()
        served = asyncio.create_task(serve_role(role, host="127.0.0.1", port=port, security=Security(insecure=True)))
        url = f"http://127.0.0.1:{port}/"
        try:
            async with H2Transport(insecure=True, timeout=10) as t:
                for _ in range(200):  # until it listens
                    try:
                        health = await t.request(url, "GET", "health")
                        break
                    except Exception:
                        await asyncio.sleep(0.02)
                claims = {"content-type": MEDIA_TYPE, "x-sdcp-peer-uri": ROUTER, "x-sdcp-peer-role": "router"}
                opened = await t.request(url, "POST", "sessions", body=session_open(S, contract()).encode(),
                                         headers=claims)
            return opened.status, json.loads(opened.body)["type"], health.status
        finally:
            served.cancel()
            await asyncio.gather(served, return_exceptions=True)
            mlc.close()

    status, kind, health = run(scenario())
    assert health == 204
    assert status == 403 and kind.endswith("sdcp-forbidden")
