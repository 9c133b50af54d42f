"""A faithful verifier that chooses differently wherever the draft is silent: our verifier
behind tests/conform/harness.py's hook, with

- the 409's session-state under another member name (``current``), byte strings in base64url,
  and problem type URIs under another base (the draft fixes only the Table 2 suffix);
- rule 2 not supported: a rule-2 contract is 422 sdcp-bad-contract (Table 2: "Contract
  invalid or not supported");
- ``m_max = 0`` accepted (the CDDL is ``uint .le 64``): the session-state is answered with the
  contract's own d[0] (no round can be proposed under it; the kit proposes none);
- a contract whose fallback holds an unknown action refused as not supported;
- m_cap never restored after a reduce (§6.5.1 SHOULD).

The kit must report no failure, and these choices as interpretations.
"""

from __future__ import annotations

import base64
import hashlib
import json
from typing import Any

from sdcp_fast.protocol import SessionState, cbor, prefix_digest
from sdcp_fast.protocol.control import SpeculationControl
from sdcp_fast.transport.base import Request, Response

from .faultkit import Handler, problem, rewrite

OTHER_BASE = "https://sdcp.example/problems/"


def _b64(value: str) -> str:
    return base64.urlsafe_b64encode(bytes.fromhex(value)).decode().rstrip("=")


def _problem_style(request: Request, response: Response, memory: dict[str, Any]) -> Response:
    if not response.content_type.startswith("application/problem+json"):
        return response
    body = json.loads(response.body)
    body["type"] = OTHER_BASE + str(body.get("type", "")).rsplit(":", 1)[-1]
    state = body.pop("session_state", None)
    if state is not None:
        body["current"] = {**state, "session": _b64(state["session"]), "digest": _b64(state["digest"])}
    return Response(response.status, json.dumps(body).encode(), response.headers)


async def _contract_choices(request: Request, handler: Handler, memory: dict[str, Any]) -> Any:
    if request.method != "POST" or request.path != "sessions":
        return None
    try:
        message = cbor.decode(request.body)
        contract = message["contract"]
    except Exception:  # noqa: BLE001 - malformed: the verifier's to refuse
        return None
    if not isinstance(contract, dict):
        return None
    if contract.get("rule") == 2 or any(a not in (1, 2, 3, 5) for a in contract.get("fallback", [])):
        return problem(422, "sdcp-bad-contract", detail="not supported by this verifier")
    if contract.get("m_max") == 0:
        digest = hashlib.sha256(b"SDCP-CONTRACT-1\x00" + cbor.deterministic_cbor(contract)).digest()
        d0 = prefix_digest(digest, tuple(message["prompt"]))
        state = SessionState(session=message["session"], epoch=message["epoch"], round=0, committed=0, digest=d0)
        return Response(200, state.encode(), {"content-type": "application/sdcp+cbor"})
    return None


_after_round = SpeculationControl.after_round


def _no_restore(self: SpeculationControl, accepted: int, proposed: int, load: int) -> Any:
    before = self.m_cap
    decision = _after_round(self, accepted, proposed, load)
    if decision.m_cap > before:
        self.m_cap = before
        return type(decision)(decision.action, before, decision.low)
    return decision


def different_choices(handler: Handler) -> Handler:
    return rewrite(post=_problem_style)(rewrite(_contract_choices)(handler))


PATCHES = [(SpeculationControl, "after_round", _no_restore)]
