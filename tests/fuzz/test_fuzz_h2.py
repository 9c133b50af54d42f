"""A smaller fuzzing run over the real carrier: the verifier role served over HTTP/2 + TLS 1.3
with client certificates on loopback, called with the router's and the drafter's
certificates (``SDCP_FUZZ_H2`` inputs, 600 by default). Same checks as in process, plus: the
connection survives every refusal, and the committed state moves only by verdicts."""

from __future__ import annotations

import asyncio
import os
import random
from typing import Any

from sdcp_fast.model.toy import ToyTarget
from sdcp_fast.protocol import MEDIA_TYPE, Policy, Sampling, Verdict, session_path_id
from sdcp_fast.protocol.peer import PeerRole
from sdcp_fast.roles.verifier import VerifierConfig, VerifierRole
from sdcp_fast.roles.wire import SdcpClient
from sdcp_fast.store import embedded
from sdcp_fast.transport.certs import InstanceSpec, instance_files, write_certificates
from sdcp_fast.transport.h2client import H2Transport
from sdcp_fast.transport.h2server import serve
from sdcp_fast.transport.inprocess import InProcessNetwork
from sdcp_fast.transport.tls import client_context, server_context
from tests.roles.rolekit import TARGET, assignment, contract, greedy, proposal, session_open, sid

from .fuzzkit import check_answer, decoder_problem, variants

INPUTS = int(os.environ.get("SDCP_FUZZ_H2", "600"))
DRAFTER = "https://127.0.0.1:8511/"


def test_verifier_over_http2_and_mtls(tmp_path) -> None:
    write_certificates(tmp_path, [InstanceSpec("router", PeerRole.ROUTER, "https://127.0.0.1:8500/"),
                                  InstanceSpec("verifier", PeerRole.VERIFIER, "https://127.0.0.1:8501/"),
                                  InstanceSpec("drafter", PeerRole.DRAFTER, DRAFTER)])

    async def scenario() -> tuple[int, int]:
        mlc = embedded(str(tmp_path / "mlc"))
        target = ToyTarget()
        config = VerifierConfig(uri="https://127.0.0.1:8501/", target_digest=TARGET, backend="reference",
                                batch_wait=0.0, output_wait=0.0)
        role = VerifierRole(target, config, mlc=mlc, transport=InProcessNetwork().transport(None))
        await role.start()
        server = await serve(role.handler, "127.0.0.1", 0, ssl=server_context(*instance_files(tmp_path, "verifier")))
        url = f"https://127.0.0.1:{server.port}/"
        as_router = H2Transport(client_context(*instance_files(tmp_path, "router")), timeout=20)
        as_drafter = H2Transport(client_context(*instance_files(tmp_path, "drafter")), timeout=20)
        try:
            router, drafter = SdcpClient(as_router), SdcpClient(as_drafter)
            opened = session_open(sid(1), contract(max_new=100_000))
            state = await router.open_session(url, opened)
            state = await router.put_drafter(url, assignment(opened, state, drafter=DRAFTER))
            state = await drafter.propose(url, proposal(state, greedy(target, opened.prompt, 2), drafter=DRAFTER))
            rng = random.Random(20261130)
            pid = session_path_id(sid(1))
            bases: list[tuple[str, str, Any, H2Transport]] = [
                ("POST", "sessions", session_open(sid(2), contract()), as_router),
                ("PUT", f"sessions/{pid}/drafter", assignment(opened, state, drafter=DRAFTER), as_router),
                ("POST", f"sessions/{pid}/policy",
                 Policy(session=sid(1), from_round=50, sampling=Sampling(temperature_milli=0)), as_router),
                ("POST", "proposals", proposal(state, (1, 2, 3), drafter=DRAFTER), as_drafter),
                ("POST", "proposals", proposal(state, (1,), drafter=DRAFTER), as_router),
            ]
            before = list(role.sessions.get(sid(1)).output(0).tokens)
            moved: list[int] = []
            served = 0
            per = max(1, INPUTS // len(bases))
            for method, path, message, transport in bases:
                for body in variants(message, rng, per):
                    response = await transport.request(url, method, path, body=body,
                                                       headers={"content-type": MEDIA_TYPE})
                    served += 1
                    problem = decoder_problem(type(message), body) if response.status >= 400 else None
                    expect = None
                    if transport is as_router and path == "proposals":
                        expect = "sdcp-not-assigned"  # §6.3: any client but the assigned drafter
                    elif problem is not None:
                        expect = problem.suffix
                    check_answer(response, expect=expect, context=(method, path, body[:200]))
                    if path == "proposals" and response.status == 200:
                        verdict = Verdict.decode(response.body)
                        if verdict.committed > len(before) + len(moved):
                            moved.extend(verdict.emitted)
            after = list(role.sessions.get(sid(1)).output(0).tokens)
            assert after == before + moved
            return served, len(as_router._connections) + len(as_drafter._connections)
        finally:
            await as_router.close()
            await as_drafter.close()
            await server.__aexit__(None, None, None)
            await role.close()
            mlc.close()

    served, connections = asyncio.run(asyncio.wait_for(scenario(), 300))
    assert served >= INPUTS - 5 and connections == 2  # one connection each, never dropped
