"""Verifiers wrong on purpose: for every check of the kit, one that the check must catch.

Each :class:`Fault` is our verifier with one deliberate violation of the draft, made through
tests/conform/harness.py's hook: ``wrap`` answers in the verifier's place (rewriting its
request or answer), ``patches`` replace one function of the protocol core or the role for the
run, ``scorer`` replaces the target. ``catches`` names the checks that must report it as a
failure; ``groups`` the parts of the kit to run (tests/conform/test_self.py).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch

from sdcp_fast.model.toy import ToyTarget
from sdcp_fast.protocol import (
    Action,
    Assignment,
    Output,
    Policy,
    SessionOpen,
    SessionState,
    Verdict,
)
from sdcp_fast.protocol import session as session_module
from sdcp_fast.protocol.control import SpeculationControl
from sdcp_fast.protocol.peer import PeerRole
from sdcp_fast.protocol.randoms import VerifierRandom
from sdcp_fast.protocol.registry import SessionRegistry
from sdcp_fast.protocol.session import VerifierSession
from sdcp_fast.transport.base import Request, Response

from .faultkit import (
    PROBLEM,
    Fault,
    Handler,
    problem,
    proposal_of,
    retyped,
    rewrite,
    suffix_of,
    verdict_edited,
)

# -- the planted violations (TLS 1.2 accepted is tests/conform/test_probes.py's), and the
# router certificate's proposal answered with the wrong 403 ---------------------------------

def _epochs(request: Request, response: Response, memory: dict[str, Any]) -> Response:
    if response.status == 200 and request.path.startswith("sessions") and request.method in ("POST", "PUT"):
        state = SessionState.decode(response.body)
        memory.setdefault("epoch", {})[state.session] = state.epoch
    return response


async def _fence_first(request: Request, handler: Handler, memory: dict[str, Any]) -> Any:
    p = proposal_of(request)
    if p is not None and p.epoch != memory.get("epoch", {}).get(p.session, p.epoch):
        return problem(409, "sdcp-stale-epoch")
    return None


def _wrong_round(request: Request, response: Response, memory: dict[str, Any]) -> Response:
    p = proposal_of(request)
    if p is not None and suffix_of(response) == "sdcp-stale-base":
        state = json.loads(response.body).get("session_state", {})
        if p.round != state.get("round", -1) + 1:
            return retyped(response, 409, "sdcp-stale-epoch")
    return response


def _old_state(request: Request, response: Response, memory: dict[str, Any]) -> Response:
    if response.status == 409 and b"session_state" in response.body:
        body = json.loads(response.body)
        body["session_state"]["round"] = max(0, body["session_state"]["round"] - 1)
        return Response(409, json.dumps(body).encode(), PROBLEM)
    return response


def _truncate_max_new_only(self: VerifierSession, emitted: tuple[int, ...]) -> tuple[int, ...]:
    return emitted[: self.contract.max_new - self.committed]


def _finishes_max_new_only(self: VerifierSession, emitted: tuple[int, ...]) -> bool:
    return self.committed + len(emitted) >= self.contract.max_new


_after_round = SpeculationControl.after_round


def _reduce_keeps(self: SpeculationControl, accepted: int, proposed: int, load: int) -> Any:
    before = self.m_cap
    decision = _after_round(self, accepted, proposed, load)
    if decision.action is Action.REDUCE:
        self.m_cap = before
        return replace(decision, m_cap=before)
    return decision


_escalate = SpeculationControl._escalate


def _j_stays(self: SpeculationControl, load: int) -> Action:
    j = self.j
    action = _escalate(self, load)
    self.j = j
    return action


def _low_zero(request: Request, response: Response, memory: dict[str, Any]) -> Response:
    if proposal_of(request) is not None and response.status == 200:
        return verdict_edited(response, low=0)
    return response


_open = SessionRegistry.open


def _reopen_lower(self: SessionRegistry, message: SessionOpen, **kw: Any) -> Any:
    held = self._held.get(message.session)
    if held is not None and message.epoch < held.session.epoch:
        del self._held[message.session]
    return _open(self, message, **kw)


async def _refused_commits(request: Request, handler: Handler, memory: dict[str, Any]) -> Any:
    p = proposal_of(request)
    if p is None:
        return None
    response = await handler(request)
    if suffix_of(response) == "sdcp-limit":
        await handler(replace(request, body=replace(p, tokens=p.tokens[:1]).encode()))
    return response


PLANTED = [
    Fault("fencing before authorization", ("auth-before-fencing",), ("session",),
          rewrite(_fence_first, _epochs)),
    Fault("wrong round answered sdcp-stale-epoch", ("stale-round",), ("refusals",), rewrite(post=_wrong_round)),
    Fault("the 409's session-state is not the current one", ("stale-state",), ("refusals",),
          rewrite(post=_old_state)),
    Fault("no truncation after a stop token", ("truncate-stop",), ("rule1",),
          patches=[(VerifierSession, "_truncate", _truncate_max_new_only),
                   (VerifierSession, "_finishes", _finishes_max_new_only)]),
    Fault("reduce does not halve m_cap", ("reduce-halves",), ("ladder",),
          patches=[(SpeculationControl, "after_round", _reduce_keeps)]),
    Fault("the ladder position j does not advance", ("ladder",), ("ladder",),
          patches=[(SpeculationControl, "_escalate", _j_stays)]),
    Fault("the verdict's low counter always 0", ("low-counter",), ("ladder",), rewrite(post=_low_zero)),
    Fault("a session re-opened at a lower epoch", ("lower-epoch-open",), ("recovery",),
          patches=[(SessionRegistry, "open", _reopen_lower)]),
    Fault("a refused round still commits", ("refused-commits-nothing",), ("refusals",),
          rewrite(_refused_commits)),
    Fault("a router certificate's proposal answered sdcp-forbidden", ("router-proposes",), ("session",),
          rewrite(post=lambda q, s, m: retyped(s, 403, "sdcp-forbidden")
                  if proposal_of(q) is not None and q.peer is not None and q.peer.role is PeerRole.ROUTER else s)),
]


# -- one more for each check the planted ones leave uncaught -------------------------------

class AcceptsAnything(ToyTarget):
    """A target whose scoring pass favours whatever was proposed: the output then depends on
    the proposal, which rule 1 forbids (and rule 2 at temperature 0)."""

    def score(self, batch: Any) -> list[torch.Tensor]:
        rows = super().score(batch)
        for req, row in zip(batch, rows, strict=True):
            for i, token in enumerate(req.proposal):
                row[i, token] = row[i].max() + 10.0
        return rows


def _on_problem(suffix: str, status: int, new_suffix: str) -> Callable[[Handler], Handler]:
    return rewrite(post=lambda q, s, m: retyped(s, status, new_suffix) if suffix_of(s) == suffix else s)


def _answers(pred: Callable[[Request], bool], answer: Callable[[], Response]) -> Callable[[Handler], Handler]:
    async def pre(request: Request, handler: Handler, memory: dict[str, Any]) -> Any:
        return answer() if pred(request) else None
    return rewrite(pre)


def _session_open(q: Request) -> SessionOpen | None:
    if q.method == "POST" and q.path == "sessions":
        try:
            return SessionOpen.decode(q.body)
        except Exception:  # noqa: BLE001
            return None
    return None


def _replay_differs(q: Request, s: Response, memory: dict[str, Any]) -> Response:
    if proposal_of(q) is None or s.status != 200:
        return s
    seen = memory.setdefault("seen", set())
    if q.body in seen:
        return verdict_edited(s, load=(Verdict.decode(s.body).load + 1) % 100)
    seen.add(q.body)
    return s


async def _busy_if_identical(request: Request, handler: Handler, memory: dict[str, Any]) -> Any:
    if proposal_of(request) is None:
        return None
    flying = memory.setdefault("flying", set())
    if request.body in flying:
        return problem(409, "sdcp-stale-base")
    flying.add(request.body)
    try:
        await asyncio.sleep(0.01)
        return await handler(request)
    finally:
        flying.discard(request.body)


def _after_switch(q: Request, s: Response, memory: dict[str, Any]) -> Response:
    p = proposal_of(q)
    if p is None:
        return s
    if p.session in memory.setdefault("switched", set()):
        return problem(403, "sdcp-not-assigned")
    if s.status == 200 and Verdict.decode(s.body).action == Action.SWITCH:
        memory["switched"].add(p.session)
    return s


def _self_round_skipped(q: Request, s: Response, memory: dict[str, Any]) -> Response:
    p = proposal_of(q)
    if p is not None and s.status == 200 and Verdict.decode(s.body).action == Action.SELF_DECODE:
        memory.setdefault("self", set()).add(p.session)
    if q.method == "PUT" and s.status == 200:
        state = SessionState.decode(s.body)
        if state.session in memory.get("self", set()):
            return Response(200, replace(state, round=state.round + 1).encode(), s.headers)
    return s


async def _policy_now(request: Request, handler: Handler, memory: dict[str, Any]) -> Any:
    if request.method == "POST" and request.path.endswith("/policy"):
        policy = Policy.decode(request.body)
        if policy.from_round > 1:
            return replace(request, body=replace(policy, from_round=policy.from_round - 2).encode())
    return None


def _output_extra(q: Request, s: Response, memory: dict[str, Any]) -> Response:
    if q.method == "GET" and s.status == 200:
        out = Output.decode(s.body)
        if not out.tokens and not out.final:
            return Response(200, replace(out, tokens=(0,)).encode(), s.headers)
    return s


async def _stale_assignment_taken(request: Request, handler: Handler, memory: dict[str, Any]) -> Any:
    if request.method == "PUT" and request.path.endswith("/drafter"):
        a = Assignment.decode(request.body)
        if a.epoch < memory.get(a.session, 0):
            return replace(request, body=replace(a, epoch=memory[a.session]).encode())
        memory[a.session] = a.epoch
    return None


_append_done = VerifierSession.append_done


def _fence_ignored(self: VerifierSession, *, ok: bool, fenced: bool = False) -> Any:
    """The session keeps a round whose append was fenced: its retry is then answered."""
    return _append_done(self, ok=ok or fenced, fenced=False)


def _rule2_without_q(q: Request) -> bool:
    p = proposal_of(q)
    return p is not None and p.q_rows is None and len(p.tokens) == 2 and p.round == 1


class _PurposesSwapped(VerifierRandom):
    """§6.4's derivation with the purpose octet swapped (0 for the draw, 1 for the test)."""

    def uniform(self, round: int, i: int, purpose: int) -> float:
        return super().uniform(round, i, 1 - purpose)


_open_state = rewrite(post=lambda q, s, m: Response(200, replace(SessionState.decode(s.body), round=1).encode(),
                                                    s.headers)
                      if _session_open(q) is not None and s.status == 200 else s)
_open_epoch2_round0 = rewrite(post=lambda q, s, m: Response(200, replace(SessionState.decode(s.body), round=0)
                                                            .encode(), s.headers)
                              if (o := _session_open(q)) is not None and o.epoch == 2 and s.status == 200 else s)

OTHERS = [
    Fault("bad contracts answered 400", ("invalid-contracts", "unknown-contract-key", "m-max-65", "wrong-target"),
          ("contracts",), _on_problem("sdcp-bad-contract", 400, "sdcp-bad-request")),
    Fault("d[0] of a contract with sampling is wrong", ("valid-contracts",), ("contracts",),
          rewrite(post=lambda q, s, m: Response(200, replace(SessionState.decode(s.body), digest=bytes(32))
                                                .encode(), s.headers)
                  if (o := _session_open(q)) is not None and o.contract.sampling is not None and s.status == 200
                  else s)),
    Fault("the kit's reference vectors are wrong", ("reference-digests",), ("contracts",), kit={"vectors": "bad"}),
    Fault("bodies as application/cbor", ("media-type",), ("session",),
          rewrite(post=lambda q, s, m: Response(s.status, s.body, {"content-type": "application/cbor"})
                  if s.status == 200 else s)),
    Fault("errors as text/plain", ("problem-details",), ("auth",),
          rewrite(post=lambda q, s, m: Response(s.status, b"no", {"content-type": "text/plain"})
                  if s.status >= 400 else s)),
    Fault("a drafter's session-open is a 500", ("router-only",), ("auth",),
          _answers(lambda q: q.path == "sessions" and q.peer is not None and q.peer.role is PeerRole.DRAFTER,
                   lambda: problem(500, "sdcp-internal-error"))),
    Fault("an unknown session's output is a 500", ("unknown-session",), ("auth",),
          _on_problem("sdcp-unknown-session", 500, "sdcp-internal-error")),
    Fault("session-open answers round 1", ("open-state",), ("session",), _open_state),
    Fault("not-assigned answered sdcp-forbidden", ("assigned-only", "drafter-failover"), ("session", "recovery"),
          _on_problem("sdcp-not-assigned", 403, "sdcp-forbidden")),
    Fault("stale epoch answered sdcp-stale-base", ("stale-epoch", "old-epoch-proposal"), ("refusals", "recovery"),
          _on_problem("sdcp-stale-epoch", 409, "sdcp-stale-base")),
    Fault("stale base answered 400", ("stale-base",), ("refusals",),
          _on_problem("sdcp-stale-base", 400, "sdcp-bad-request")),
    Fault("unknown keys refused", ("unknown-keys",), ("refusals",),
          _answers(lambda q: proposal_of(q) is not None and b"x-unknown" in q.body,
                   lambda: problem(400, "sdcp-bad-request"))),
    Fault("a replay gets another verdict", ("replay",), ("rule1",), rewrite(post=_replay_differs)),
    Fault("an identical request in progress is refused", ("identical-in-progress",), ("rule1",),
          rewrite(_busy_if_identical)),
    Fault("sdcp-limit answered sdcp-bad-proposal", ("limit-m-max", "limit-m-cap"), ("refusals", "ladder"),
          _on_problem("sdcp-limit", 422, "sdcp-bad-proposal")),
    Fault("the verdict's digest is not the chain's", ("verdict-chain",), ("rule1",),
          rewrite(post=lambda q, s, m: verdict_edited(s, digest=bytes(32))
                  if proposal_of(q) is not None and s.status == 200 else s)),
    Fault("no truncation at all", ("truncate-max-new",), ("rule1",),
          patches=[(VerifierSession, "_truncate", lambda self, emitted: emitted)]),
    Fault("a closed session answers sdcp-stale-base", ("closed-after-finish",), ("rule1",),
          _on_problem("sdcp-session-closed", 409, "sdcp-stale-base")),
    Fault("the target favours the proposal", ("rule1-exact", "rule2-temperature-0"), ("rule1", "rule2"),
          scorer=AcceptsAnything()),
    Fault("rule 2 without q_rows is a 500", ("rule2-needs-q",), ("rule2",),
          _answers(_rule2_without_q, lambda: problem(500, "sdcp-internal-error"))),
    Fault("q(x) = 0 answered sdcp-q-unavailable", ("rule2-q-zero",), ("rule2",),
          _on_problem("sdcp-bad-proposal", 409, "sdcp-q-unavailable")),
    Fault("rows unavailable answered sdcp-bad-proposal", ("rule2-q-unavailable",), ("rule2",),
          _on_problem("sdcp-q-unavailable", 422, "sdcp-bad-proposal")),
    Fault("seeded draws with the purposes swapped", ("rule2-seeded",), ("rule2",),
          patches=[(session_module, "VerifierRandom", _PurposesSwapped)]),
    Fault("a policy applied two rounds early", ("policy-from-round",), ("rule2",), rewrite(_policy_now)),
    Fault("a policy for round 0 is a 500", ("policy-past-round",), ("refusals",),
          _answers(lambda q: q.path.endswith("/policy") and Policy.decode(q.body).from_round == 0,
                   lambda: problem(500, "sdcp-internal-error"))),
    Fault("m_cap above m_max", ("m-cap-range",), ("rule1",),
          rewrite(post=lambda q, s, m: verdict_edited(s, m_cap=Verdict.decode(s.body).m_cap + 10)
                  if proposal_of(q) is not None and s.status == 200 else s)),
    Fault("no fail when the ladder runs out", ("ladder-exhausted",), ("ladder",),
          patches=[(SpeculationControl, "_escalate",
                    lambda self, load: Action.CONTINUE if self.j >= len(self.contract.fallback)
                    else _escalate(self, load))]),
    Fault("an unknown action is applied as continue", ("unknown-action",), ("ladder",),
          patches=[(SpeculationControl, "_escalate",
                    lambda self, load: Action.CONTINUE if 9 in self.contract.fallback else _escalate(self, load))]),
    Fault("the drafter's proposals refused after a switch and a new assignment", ("switch-reassign",),
          ("ladder",), rewrite(post=_after_switch)),
    Fault("self-decoding skips a round number", ("self-decode",), ("ladder",), rewrite(post=_self_round_skipped)),
    Fault("output of the wrong epoch", ("output",), ("rule1",),
          rewrite(post=lambda q, s, m: Response(200, replace(Output.decode(s.body), epoch=7).encode(), s.headers)
                  if q.method == "GET" and s.status == 200 else s)),
    Fault("a waiting output returns a token never committed", ("output-wait",), ("rule1",),
          rewrite(post=_output_extra)),
    Fault("a fenced round is released", ("fenced",), ("recovery",),
          patches=[(VerifierSession, "append_done", _fence_ignored)]),
    Fault("resume answers round 0", ("resume",), ("recovery",), _open_epoch2_round0),
    Fault("an assignment of an older epoch is taken", ("assignment-stale-epoch",), ("recovery",),
          rewrite(_stale_assignment_taken)),
]

FAULTS = PLANTED + OTHERS
# Checks that cannot fail by design: a SHOULD (an implementation that does not follow it is an
# interpretation), and statements the kit cannot reach in process (tests/conform/test_probes.py
# has the transport's; events and load need the deployment's router and traffic).
NEVER_FAIL = {"m-cap-restore"}
NOT_IN_PROCESS = {"tls13-only", "h2-only", "mutual-tls", "events", "m-cap-load"}
