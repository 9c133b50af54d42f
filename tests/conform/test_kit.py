"""The conformance kit against a verifier role in process (fast, no processes): our verifier
passes, and verifiers broken on purpose are caught, so a weakened check shows up here."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from roles.rolekit import TARGET

from sdcp_fast.conform.kit import Answer, Conform, Identities
from sdcp_fast.conform.report import Outcome
from sdcp_fast.embedded import embedded
from sdcp_fast.model.toy import ToyTarget
from sdcp_fast.protocol import Verdict
from sdcp_fast.protocol.peer import Peer, PeerRole
from sdcp_fast.roles.verifier import VerifierRole
from sdcp_fast.transport.base import Request, Response
from sdcp_fast.transport.inprocess import InProcessNetwork

VERIFIER = "https://127.0.0.1:8501/"
IDS = Identities(router=Peer("https://127.0.0.1:8500/", PeerRole.ROUTER),
                 drafter=Peer("https://127.0.0.1:8511/", PeerRole.DRAFTER))


def _digest_flipped(response: Response, request: Request) -> Response:
    if request.path == "proposals" and response.status == 200:
        v = Verdict.decode(response.body)
        return Response(200, Verdict(**{**v.__dict__, "digest": bytes(32)}).encode(), response.headers)
    return response


def _epoch_unchecked(response: Response, request: Request) -> Response:
    if response.status == 409 and b"stale-epoch" in response.body:
        body = json.loads(response.body)
        body["type"] = body["type"].replace("sdcp-stale-epoch", "sdcp-stale-base")
        return Response(409, json.dumps(body).encode(), response.headers)
    return response


def _run(tmp_path: Any, tamper: Any = None) -> dict[str, Outcome]:
    async def scenario() -> dict[str, Outcome]:
        mlc = embedded(str(tmp_path))
        role = VerifierRole(ToyTarget(), uri=VERIFIER, mlc=mlc, transport=InProcessNetwork().transport(None),
                            target_digest=TARGET, backend="reference", batch_wait=0.0, output_wait=0.0)
        await role.start()

        def sender(peer: Peer) -> Any:
            async def send(method: str, path: str, body: bytes = b"", query: Any = None) -> Answer:
                headers = {"content-type": "application/sdcp+cbor"} if body else {}
                request = Request(method, path, query=query or {}, body=body, headers=headers, peer=peer)
                response = await role.handler(request)
                if tamper is not None:
                    response = tamper(response, request)
                return Answer(response.status, response.body, response.content_type)
            return send

        async def put_q(uri: str, data: bytes) -> None:
            mlc.put(uri, data)

        try:
            kit = Conform(VERIFIER, as_router=sender(IDS.router), as_drafter=sender(IDS.drafter), ids=IDS,
                          target_digest=TARGET, vocab=ToyTarget().vocab_size, put_q=put_q)
            report = await kit.run()
        finally:
            await role.close()
            mlc.close()
        return {f.statement: f.outcome for f in report.findings}

    return asyncio.run(asyncio.wait_for(scenario(), 120))


def test_our_verifier_in_process_passes(tmp_path: Any) -> None:
    outcomes = _run(tmp_path)
    assert Outcome.FAIL not in outcomes.values(), [s for s, o in outcomes.items() if o is Outcome.FAIL]
    assert sum(o is Outcome.PASS for o in outcomes.values()) >= 25
    for statement in ("the kit's reference digests equal the published vectors (contracts.json, prefix.json)",
                      "published valid contracts open a session whose d[0] follows the contract digest",
                      "published invalid contracts are refused with their problem type",
                      "an unknown action value (in the contract's fallback) is treated as fail"):
        assert outcomes[statement] is Outcome.PASS


@pytest.mark.parametrize(("tamper", "statement"), [
    (_digest_flipped, "rule 1: verdict fields (a <= M, emitted, n, d[n], round, 1 <= m_cap <= m_max)"),
    (_epoch_unchecked, "a proposal whose epoch differs is refused with 409 sdcp-stale-epoch"),
])
def test_a_broken_verifier_is_caught(tmp_path: Any, tamper: Any, statement: str) -> None:
    outcomes = _run(tmp_path, tamper)
    assert outcomes[statement] is Outcome.FAIL
