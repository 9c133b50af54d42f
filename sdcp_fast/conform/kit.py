"""``sdcp-fast conform URL``: a black-box client that checks an SDCP verifier (and, as far as
is reachable from outside, a drafter or a router) against the draft.

It speaks only the draft's messages over HTTP/2 + TLS 1.3 with client certificates, with two
identities from the deployment's CA: a **router** (it opens sessions and names the drafter,
§6.1) and a **drafter** (it proposes, §6.2). Rule-2 rounds need q rows in the MLC the verifier
reads, which the kit writes as the drafter (``mlc``). It knows nothing of the target model:
rule 1 is checked by its invariants (the verdict's fields, the digest chain, output indices,
and that the committed output does not depend on what is proposed), rule 2 by its
preconditions (q(x) = 0, rows unavailable) and by the same invariants. Each check records the
statement it exercised in a :class:`~sdcp_fast.conform.report.Report`.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from sdcp_fast.conform.report import Report
from sdcp_fast.protocol import (
    Action,
    Assignment,
    Contract,
    Output,
    Policy,
    Proposal,
    Sampling,
    SessionOpen,
    SessionState,
    Status,
    Verdict,
    cbor,
    contract_digest,
    extend_digest,
    prefix_digest,
    session_path_id,
)
from sdcp_fast.protocol.messages import ROLE_DRAFTER, RULE_GREEDY, RULE_SPECULATIVE
from sdcp_fast.protocol.peer import Peer
from sdcp_fast.protocol.problems import type_suffix

Send = Callable[..., Awaitable[Any]]


@dataclass
class Answer:
    status: int
    body: bytes
    content_type: str

    @property
    def suffix(self) -> str | None:
        if not self.content_type.startswith("application/problem+json"):
            return None
        try:
            return type_suffix(json.loads(self.body)["type"])
        except (ValueError, KeyError, TypeError):
            return None

    def problem(self) -> dict[str, Any]:
        try:
            body = json.loads(self.body)
        except ValueError:
            return {}
        return body if isinstance(body, dict) else {}


@dataclass
class Identities:
    """The kit's two client identities: base URI and role from each certificate's URI SANs."""

    router: Peer
    drafter: Peer


def certificate_peer(path: str) -> Peer:
    """The identity (base URI, role) a certificate gives, read from its URI SANs."""
    from cryptography import x509

    from sdcp_fast.protocol.peer import peer_from_uris

    with open(path, "rb") as f:
        cert = x509.load_pem_x509_certificate(f.read())
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return Peer(None, None)
    return peer_from_uris(sans.get_values_for_type(x509.UniformResourceIdentifier))


class Conform:
    """The checks. ``as_router`` / ``as_drafter`` send ``(method, path, body, query)`` to the
    instance under test with that identity and return an :class:`Answer`; ``put_q`` writes an
    object to the MLC as the drafter (None: rule-2 checks are not reachable)."""

    def __init__(self, target: str, *, as_router: Send, as_drafter: Send, ids: Identities,
                 target_digest: bytes | None, vocab: int | None = None, put_q: Send | None = None,
                 scope: bytes | None = None, stranger: Send | None = None, vectors: str | None = None) -> None:
        self.target = target
        self.as_router = as_router
        self.as_drafter = as_drafter
        self.stranger = stranger  # a connection without a client certificate, if the caller made one
        self.ids = ids
        self.target_digest = target_digest
        self.vocab = vocab
        self.put_q = put_q
        self.scope = scope or os.urandom(16)
        self.vectors = vectors if vectors is not None else default_vectors()
        self.report = Report(target, "verifier")

    # -- helpers --------------------------------------------------------------------------

    def _sid(self) -> bytes:
        return os.urandom(16)

    def contract(self, rule: int = RULE_GREEDY, **kw: Any) -> Contract:
        fields: dict[str, Any] = dict(
            target=self.target_digest or bytes(32), tokenizer=hashlib.sha256(b"sdcp-conform").digest(), rule=rule,
            m_max=4, max_new=12, stop=(), low_rounds=1_000_000, fallback=(int(Action.FAIL),), scope=self.scope,
            sampling=Sampling(temperature_milli=1000, seed=7) if rule == RULE_SPECULATIVE else None)
        fields.update(kw)
        return Contract(**fields)

    def session_open(self, c: Contract, session: bytes | None = None, prompt: tuple[int, ...] = (1, 2, 3),
                     epoch: int = 1) -> SessionOpen:
        from sdcp_fast.cache.uri import object_uri

        session = session or self._sid()
        return SessionOpen(session=session, epoch=epoch, contract=c, prompt=prompt,
                           commit_log=object_uri(self.scope, session, "commit_log"))

    async def open(self, c: Contract, prompt: tuple[int, ...] = (1, 2, 3), *,
                   assign: bool = True) -> tuple[SessionOpen, SessionState]:
        opened = self.session_open(c, prompt=prompt)
        answer = await self.as_router("POST", "sessions", opened.encode())
        if answer.status != 200:
            raise ConformError(f"POST sessions answered {answer.status} {answer.body[:200]!r}")
        state = SessionState.decode(answer.body)
        if assign:
            state = await self.assign(opened, state)
        return opened, state

    async def assign(self, opened: SessionOpen, state: SessionState, drafter: str | None = None) -> SessionState:
        a = Assignment(session=opened.session, epoch=opened.epoch, contract=opened.contract, verifier=self.target,
                       drafter=drafter or self.ids.drafter.uri or "", prompt=opened.prompt, round=state.round,
                       committed=state.committed, digest=state.digest, m_init=opened.contract.m_max)
        answer = await self.as_router("PUT", f"sessions/{session_path_id(opened.session)}/drafter", a.encode())
        if answer.status != 200:
            raise ConformError(f"PUT sessions/{{id}}/drafter answered {answer.status} {answer.body[:200]!r}")
        return SessionState.decode(answer.body)

    def proposal(self, state: SessionState | Verdict, tokens: tuple[int, ...], **kw: Any) -> Proposal:
        status = Status(instance=self.ids.drafter.uri or "", role=ROLE_DRAFTER, load=0, queue=0, ttl_ms=10_000)
        fields: dict[str, Any] = dict(session=state.session, epoch=state.epoch, round=state.round + 1,
                                      drafter=self.ids.drafter.uri or "", base=state.committed,
                                      base_digest=state.digest, tokens=tokens, status=status)
        fields.update(kw)
        return Proposal(**fields)

    async def propose(self, p: Proposal | bytes) -> Answer:
        return await self.as_drafter("POST", "proposals", p if isinstance(p, bytes) else p.encode())

    async def output(self, session: bytes, start: int) -> Answer:
        return await self.as_drafter("GET", f"sessions/{session_path_id(session)}/output", b"", {"from": str(start)})

    def refused(self, answer: Answer, status: int, suffix: str | None) -> tuple[bool, str]:
        ok = answer.status == status and (suffix is None or answer.suffix == suffix)
        return ok, f"answered {answer.status} " + (answer.suffix or repr(answer.body[:80]))

    # -- the run --------------------------------------------------------------------------

    async def run(self) -> Report:
        r = self.report
        self.check_own_reference()
        await self.check_authentication()
        await self.check_contract_refusals()
        if self.target_digest is None:
            r.add("6.1", "every check that needs a session (give --target-digest)", None,
                  "the target digest is not known")
            return r
        try:
            await self.check_contract_vectors()
            await self.check_session_creation()
            await self.check_rule1()
            await self.check_rule1_independent_of_proposals()
            await self.check_refusals()
            await self.check_rule2()
            await self.check_unknown_action()
        except ConformError as exc:
            r.add("-", "the run could not continue", False, str(exc))
        r.add("6.8", "fenced appends fail; the fenced verifier releases nothing", None,
              "needs the commit log's store; the MLC is the operator's")
        return r

    def _vector_file(self, name: str) -> dict[str, Any] | None:
        if self.vectors is None:
            return None
        try:
            with open(os.path.join(self.vectors, name)) as f:
                data: dict[str, Any] = json.load(f)
        except OSError:
            return None
        return data

    def check_own_reference(self) -> None:
        """The digests the kit checks verifiers against are the published vectors' (§4.1, §4.2)."""
        r = self.report
        contracts, prefix = self._vector_file("contracts.json"), self._vector_file("prefix.json")
        if contracts is None or prefix is None:
            r.add("4.1/4.2", "the kit's reference digests equal the published vectors", None,
                  "no vectors folder (--vectors DIR: tests/vectors of sdcp_fast)")
            return
        bad = [v["name"] for v in contracts["valid"]
               if contract_digest(Contract.decode(bytes.fromhex(v["cbor"]))).hex() != v["digest"]]
        for chain in prefix["chains"]:
            d = [prefix_digest(bytes.fromhex(chain["contract_digest"]), tuple(chain["prompt"]))]
            for token in chain["output"]:
                d.append(extend_digest(d[-1], (token,)))
            if [x.hex() for x in d] != chain["d"]:
                bad.append(chain["name"])
        r.add("4.1/4.2", "the kit's reference digests equal the published vectors (contracts.json, prefix.json)",
              not bad, ", ".join(bad))

    async def check_contract_vectors(self) -> None:
        """contracts.json with the verifier's own target: each valid contract opens a session
        whose d[0] is the published digest rule's; each invalid one is its published problem."""
        r = self.report
        contracts = self._vector_file("contracts.json")
        if contracts is None:
            r.add("4.1", "published contract vectors: valid ones accepted, invalid ones refused", None,
                  "no vectors folder")
            return
        assert self.target_digest is not None
        for v in contracts["valid"]:
            if v["name"] == "unknown-fallback-action":
                continue  # an interpretation (docs/vectors.md): either reading is conformant
            m = cbor.decode(bytes.fromhex(v["cbor"]))
            m["target"] = self.target_digest
            opened = self.session_open(Contract.from_map(m))
            answer = await self.as_router("POST", "sessions", opened.encode())
            expected = prefix_digest(contract_digest(opened.contract), opened.prompt)
            ok = answer.status == 200 and SessionState.decode(answer.body).digest == expected
            r.add("4.1/4.2", "published valid contracts open a session whose d[0] follows the contract digest",
                  ok, f"{v['name']}: answered {answer.status}")
        for v in contracts["invalid"]:
            m = cbor.decode(bytes.fromhex(v["cbor"]))
            if isinstance(m.get("target"), bytes) and len(m["target"]) == 32:
                m["target"] = self.target_digest  # only the vector's one defect is left
            body = self.session_open(self.contract()).to_map()
            body["contract"] = m
            answer = await self.as_router("POST", "sessions", cbor.deterministic_cbor(body))
            ok, detail = self.refused(answer, 422, v["problem"])
            r.add("4.1", "published invalid contracts are refused with their problem type", ok,
                  f"{v['name']}: {detail}")

    async def check_authentication(self) -> None:
        r = self.report
        if self.stranger is not None:
            try:
                answer = await self.stranger("GET", "health", b"")
                r.add("5.1", "TLS 1.3 with mutual certificate authentication: no client certificate, no service",
                      answer.status in (401, 403), f"answered {answer.status} without a client certificate")
            except Exception as exc:  # the handshake itself refused us: what we want
                r.add("5.1", "TLS 1.3 with mutual certificate authentication: no client certificate, no service",
                      True, f"refused: {type(exc).__name__}")
        opened = self.session_open(self.contract())
        answer = await self.as_drafter("POST", "sessions", opened.encode())
        r.add("5.1/6.1", "a drafter certificate cannot open sessions (act as a router)", answer.status == 403,
              f"answered {answer.status} {answer.suffix}")

    async def check_contract_refusals(self) -> None:
        r = self.report
        wrong = self.contract(target=hashlib.sha256(b"not the verifier's model").digest())
        answer = await self.as_router("POST", "sessions", self.session_open(wrong).encode())
        r.add("6.1", "the verifier MUST refuse a contract whose target digest does not match its model",
              *self.refused(answer, 422, "sdcp-bad-contract"))
        m = self.session_open(self.contract()).to_map()
        m["contract"]["x-unknown"] = 1
        answer = await self.as_router("POST", "sessions", cbor.deterministic_cbor(m))
        r.add("4.1", "a contract with a key the draft does not define MUST be rejected (sdcp-bad-contract)",
              *self.refused(answer, 422, "sdcp-bad-contract"))
        m = self.session_open(self.contract()).to_map()
        m["contract"]["m_max"] = 65
        answer = await self.as_router("POST", "sessions", cbor.deterministic_cbor(m))
        r.add("4.1", "a contract outside the CDDL (m_max 65 > 64) is refused", answer.status in (400, 422),
              f"answered {answer.status} {answer.suffix}")
        answer = await self.as_router("POST", "sessions", b"\xa1\x61")
        r.add("5.1", "a malformed body is a 4xx Problem Details answer",
              400 <= answer.status < 500 and answer.suffix is not None, f"answered {answer.status} {answer.suffix}")

    async def check_session_creation(self) -> None:
        r = self.report
        c = self.contract()
        opened = self.session_open(c)
        answer = await self.as_router("POST", "sessions", opened.encode())
        if answer.status != 200:
            r.add("6.1", "session-open answers session-state", False, f"answered {answer.status} {answer.body[:200]!r}")
            raise ConformError("no session could be opened")
        state = SessionState.decode(answer.body)
        d0 = prefix_digest(contract_digest(c), opened.prompt)
        r.add("6.1", "the verifier answers session-state with round 0, committed 0",
              state.round == 0 and state.committed == 0 and state.epoch == 1, f"round {state.round}")
        r.add("4.2", "session-state digest is d[0] = SHA-256 over the contract digest and the prompt",
              state.digest == d0, state.digest.hex()[:16])
        again = await self.as_router("POST", "sessions", opened.encode())
        r.add("6.1", "the same session-open again answers the current state (idempotent)",
              again.status == 200 and SessionState.decode(again.body) == state, f"answered {again.status}")
        answer = await self.propose(self.proposal(state, (1,)))
        r.add("6.3", "a proposal before any assignment is refused with 403 sdcp-not-assigned",
              *self.refused(answer, 403, "sdcp-not-assigned"))
        state = await self.assign(opened, state)
        answer = await self.as_router("PUT", f"sessions/{session_path_id(opened.session)}/drafter",
                                      Assignment(session=opened.session, epoch=1, contract=c, verifier=self.target,
                                                 drafter="https://not-us.invalid/", prompt=opened.prompt,
                                                 round=0, committed=0, digest=d0, m_init=1).encode())
        if answer.status == 200:
            answer = await self.propose(self.proposal(state, (1,)))
            r.add("6.3", "only the drafter named in the latest assignment may propose (403 sdcp-not-assigned)",
                  *self.refused(answer, 403, "sdcp-not-assigned"))
        unknown = await self.output(os.urandom(16), 0)
        r.add("6.1", "an unknown session is 404", unknown.status == 404, f"answered {unknown.status}")

    async def _round(self, state: SessionState | Verdict, tokens: tuple[int, ...], c: Contract,
                     label: str, **kw: Any) -> Verdict | None:
        """One proposal; its verdict checked against §6.3/§6.4/§6.5 invariants."""
        r = self.report
        p = self.proposal(state, tokens, **kw)
        answer = await self.propose(p)
        if answer.status != 200:
            r.add("6.3", f"{label}: a proposal on the committed prefix is verified", False,
                  f"answered {answer.status} {answer.body[:200]!r}")
            return None
        v = Verdict.decode(answer.body)
        a = v.accepted
        problems = []
        if not 0 <= a <= len(tokens):
            problems.append(f"accepted {a} outside 0..M")
        if tuple(v.emitted[:a]) != tuple(tokens[:a]):
            problems.append("emitted does not start with the accepted tokens")
        if len(v.emitted) > a + 1:
            problems.append("more than one additional token")
        if v.committed != state.committed + len(v.emitted) or v.round != state.round + 1 or v.epoch != state.epoch:
            problems.append("committed/round/epoch do not follow")
        if v.digest != extend_digest(state.digest, v.emitted):
            problems.append("digest is not d[n] extended by the emitted tokens")
        if not 1 <= v.m_cap <= c.m_max or v.load > 100:
            problems.append(f"m_cap {v.m_cap} / load {v.load} out of range")
        r.add("6.3-6.5", f"{label}: verdict fields (a <= M, emitted, n, d[n], round, 1 <= m_cap <= m_max)",
              not problems, "; ".join(problems))
        replay = await self.propose(p)
        r.add("6.3", f"{label}: a replayed proposal gets the same verdict unchanged",
              replay.status == 200 and replay.body == answer.body, f"answered {replay.status}")
        return v

    async def check_rule1(self) -> None:
        r = self.report
        c = self.contract(max_new=10)
        opened, state = await self.open(c)
        committed: list[int] = []
        v: Any = state
        for i in range(12):
            v2 = await self._round(v, (i % 3 + 1, 1), c, "rule 1")
            if v2 is None:
                return
            committed.extend(v2.emitted)
            v = v2
            if v.action in (Action.FINISH, Action.FAIL):
                break
        self.rule1_output = (opened.prompt, committed)
        r.add("6.3", "emitted tokens stop at max_new", len(committed) == c.max_new and v.action == Action.FINISH,
              f"{len(committed)} committed, action {v.action}")
        answer = await self.output(opened.session, 0)
        out = Output.decode(answer.body) if answer.status == 200 else None
        r.add("6.7", "output from 0 is exactly the committed tokens, with the epoch; final with finish",
              out is not None and list(out.tokens) == committed and out.epoch == 1 and out.final
              and out.finish == Action.FINISH, f"answered {answer.status}")
        answer = await self.output(opened.session, 4)
        out = Output.decode(answer.body) if answer.status == 200 else None
        r.add("6.7", "indices are stable: output from n is the committed tokens from index n",
              out is not None and list(out.tokens) == committed[4:] and out.from_ == 4, f"answered {answer.status}")
        answer = await self.propose(self.proposal(v, (1,)))
        r.add("6.5.2", "after finish the session takes no proposal (410 sdcp-session-closed)",
              *self.refused(answer, 410, "sdcp-session-closed"))

    async def check_rule1_independent_of_proposals(self) -> None:
        """§6.4 rule 1: the output is greedy decoding whatever is proposed, so a session fed the
        first one's output as proposals commits the same tokens."""
        prompt, first = getattr(self, "rule1_output", ((), []))
        if not first:
            return
        c = self.contract(max_new=10)
        _, state = await self.open(c, prompt)
        second: list[int] = []
        v: Any = state
        while len(second) < len(first):
            n = len(second)
            v2 = await self._round(v, tuple(first[n:n + c.m_max]), c, "rule 1, proposing the output")
            if v2 is None:
                return
            second.extend(v2.emitted)
            v = v2
        self.report.add("6.4", "rule 1: the committed output does not depend on what the drafter proposes",
                        second == first, f"{len(second)} tokens")
        self.report.add("6.4", "rule 1: proposing the greedy output, every token is accepted",
                        v.committed == len(first), "")

    async def check_refusals(self) -> None:
        r = self.report
        c = self.contract(max_new=50)
        opened, state = await self.open(c)
        answer = await self.propose(self.proposal(state, (1,), epoch=state.epoch + 1))
        r.add("6.3", "a proposal whose epoch differs is refused with 409 sdcp-stale-epoch",
              *self.refused(answer, 409, "sdcp-stale-epoch"))
        answer = await self.propose(self.proposal(state, (1,), base_digest=bytes(32)))
        ok, detail = self.refused(answer, 409, "sdcp-stale-base")
        body = answer.problem()
        r.add("6.3", "a wrong base_digest is 409 sdcp-stale-base carrying the current session-state",
              ok and isinstance(body.get("session_state"), dict), detail)
        answer = await self.propose(self.proposal(state, (1,), base=state.committed + 1))
        r.add("6.3", "a base that is not the committed length is 409 sdcp-stale-base",
              *self.refused(answer, 409, "sdcp-stale-base"))
        answer = await self.propose(self.proposal(state, (1,), round=state.round + 2))
        r.add("6.3", "a round that is not the last round plus one is 409", answer.status == 409,
              f"answered {answer.status} {answer.suffix}")
        answer = await self.propose(self.proposal(state, tuple([1] * (c.m_max + 1))))
        r.add("6.2/6.5.1", "M above min(m_max, m_cap) is refused with 422 sdcp-limit",
              *self.refused(answer, 422, "sdcp-limit"))
        m = self.proposal(state, (1,)).to_map()
        m["x-unknown"] = {"nested": [1, 2]}
        m["status"]["x-also"] = "ignored"
        answer = await self.propose(cbor.deterministic_cbor(m))
        r.add("5.2", "unknown map keys outside the contract are ignored", answer.status == 200,
              f"answered {answer.status} {answer.suffix}")
        if answer.status == 200:
            state = Verdict.decode(answer.body)  # type: ignore[assignment]
        answer = await self.as_router("POST", f"sessions/{session_path_id(opened.session)}/policy",
                                      Policy(session=opened.session, from_round=0,
                                             sampling=Sampling(temperature_milli=0)).encode())
        r.add("6.6", "a policy must have from_round greater than the current round", 400 <= answer.status < 500,
              f"answered {answer.status} {answer.suffix}")
        answer = await self.as_drafter("POST", f"sessions/{session_path_id(opened.session)}/policy",
                                       Policy(session=opened.session, from_round=state.round + 5,
                                              sampling=Sampling(temperature_milli=0)).encode())
        r.add("5.1/6.6", "a drafter certificate cannot change a session's policy (act as a router)",
              answer.status == 403, f"answered {answer.status} {answer.suffix}")
        answer = await self.as_router("POST", "proposals", self.proposal(state, (1,)).encode())
        r.add("6.3", "a router certificate cannot propose (only the assigned drafter)", answer.status == 403,
              f"answered {answer.status} {answer.suffix}")

    async def check_unknown_action(self) -> None:
        """§5.2 at the verifier: a fallback entry with an action value the registry does not
        define is applied as fail once the rounds are low (or the contract is refused, an
        interpretation: then not reachable)."""
        r = self.report
        statement = "an unknown action value (in the contract's fallback) is treated as fail"
        c = self.contract(fallback=(9,), low_rounds=1, low_ratio=100, max_new=40)
        opened = self.session_open(c)
        answer = await self.as_router("POST", "sessions", opened.encode())
        if answer.status != 200:
            r.add("5.2", statement, None, f"the contract was refused ({answer.status} {answer.suffix})")
            return
        state: Any = await self.assign(opened, SessionState.decode(answer.body))
        for _ in range(8):  # a low round: fewer than all of M accepted (low_ratio 100)
            answer = await self.propose(self.proposal(state, (1, 1, 1, 1)))
            if answer.status != 200:
                r.add("5.2", statement, False, f"answered {answer.status} {answer.suffix}")
                return
            verdict = Verdict.decode(answer.body)
            if verdict.accepted < 4:
                out = await self.output(opened.session, 0)
                final = Output.decode(out.body) if out.status == 200 else None
                r.add("5.2", statement, verdict.action == Action.FAIL and final is not None and final.final
                      and final.finish == Action.FAIL, f"action {verdict.action}")
                return
            state = verdict
        r.add("5.2", statement, None, "every round was fully accepted")

    async def check_rule2(self) -> None:
        r = self.report
        if self.put_q is None or self.vocab is None:
            for statement in ("rule 2: q(x) = 0 is refused with sdcp-bad-proposal before any draw",
                              "rule 2: rows unavailable is sdcp-q-unavailable and commits nothing",
                              "rule 2: a proposal MUST carry q_rows"):
                r.add("6.3/6.4", statement, None, "needs --mlc and --vocab")
            return
        from sdcp_fast.cache.uri import object_uri

        c = self.contract(RULE_SPECULATIVE, max_new=20)
        opened, state = await self.open(c)
        v = self.vocab
        answer = await self.propose(self.proposal(state, (1, 2)))
        r.add("6.4", "rule 2: a proposal MUST carry q_rows (refused without)", 400 <= answer.status < 500,
              f"answered {answer.status} {answer.suffix}")
        missing = object_uri(self.scope, opened.session, "q_rows", 999)
        answer = await self.propose(self.proposal(state, (1, 2), q_rows=missing))
        r.add("6.3", "rule 2: rows unavailable is 409 sdcp-q-unavailable", *self.refused(answer, 409,
                                                                                           "sdcp-q-unavailable"))
        zero = bytearray(struct.pack(f"<{2 * v}f", *([1.0 / v] * (2 * v))))
        struct.pack_into("<f", zero, 4 * (v + 2), 0.0)  # q[2](x[2]) = 0 for x[2] = 2
        ref = object_uri(self.scope, opened.session, "q_rows", state.round + 1)
        await self.put_q(ref, bytes(zero))
        answer = await self.propose(self.proposal(state, (1, 2), q_rows=ref))
        r.add("6.4", "rule 2: q(x) = 0 is refused with 422 sdcp-bad-proposal", *self.refused(answer, 422,
                                                                                               "sdcp-bad-proposal"))
        out = await self.output(opened.session, 0)
        r.add("6.3", "rule 2: a refused round commits nothing",
              out.status == 200 and Output.decode(out.body).tokens == (), f"answered {out.status}")
        uniform = struct.pack(f"<{2 * v}f", *([1.0 / v] * (2 * v)))
        ref = object_uri(self.scope, opened.session, "q_rows", state.round + 1 + 1000)
        await self.put_q(ref, uniform)
        await self._round(state, (1, 2), c, "rule 2", q_rows=ref)


async def check_other_role(role: str, report: Report, *, as_router: Send, as_drafter: Send, ids: Identities) -> None:
    """``--role drafter|router``: what a client can check of those roles from outside: who may
    call them. What they send (proposals, assignments) is reachable only through a verifier."""
    report.role = role
    if role == "drafter":
        answer = await as_drafter("POST", "assignments", b"\xa0")
        report.add("5.1/6.1", "a drafter certificate cannot send assignments (act as a router)",
                   answer.status == 403, f"answered {answer.status}")
        answer = await as_router("POST", "assignments", b"\xa1\x61")
        report.add("5.1", "a malformed assignment is a 4xx Problem Details answer",
                   400 <= answer.status < 500 and answer.suffix is not None, f"answered {answer.status}")
        report.add("6.2", "one outstanding proposal per session; M within min(m_max, m_cap)", None,
                   "observable only at the verifier it proposes to")
    else:
        from sdcp_fast.protocol import Event, instance_path_id

        other = "https://not-the-drafter.invalid/"
        status = Status(instance=other, role=ROLE_DRAFTER, load=0, queue=0, ttl_ms=1000)
        answer = await as_drafter("PUT", f"instances/{instance_path_id(other)}/status", status.encode())
        report.add("6.1", "an instance reports status only for itself", answer.status == 403,
                   f"answered {answer.status}")
        event = Event(session=os.urandom(16), epoch=1, kind=Action.SWITCH, committed=0, digest=bytes(32))
        answer = await as_drafter("POST", "events", event.encode())
        report.add("5.1/6.5.2", "a drafter certificate cannot send events (act as a verifier)",
                   answer.status == 403, f"answered {answer.status}")
        report.add("6.1/6.9", "no assignment to an expired instance; fence before fail-over", None,
                   "needs control of the deployment's instances")


def default_vectors() -> str | None:
    """tests/vectors of a source checkout of sdcp_fast, when the kit runs from one."""
    here = os.path.dirname(os.path.abspath(__file__))
    candidate = os.path.normpath(os.path.join(here, "..", "..", "tests", "vectors"))
    return candidate if os.path.isfile(os.path.join(candidate, "contracts.json")) else None


class ConformError(Exception):
    """The run cannot go on (no session could be opened, ...)."""


__all__ = ["Answer", "Conform", "ConformError", "Identities", "certificate_peer", "check_other_role"]
