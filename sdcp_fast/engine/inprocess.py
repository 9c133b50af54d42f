"""Run SDCP sessions in one process: router, drafters, MLC, commit log and verifier wired
through the protocol core exactly as the services will be, minus HTTP.

Every round of every session takes the protocol's path: the drafter record builds the
proposal, rule-2 rows go through the MLC under a lease, the verifier session checks it,
one batched scoring pass covers all waiting sessions, the kernels apply the rule, the
commit record is appended to the fenced log before the verdict is released, and
switch / self-decode events go back through the router.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from itertools import accumulate

import torch

from sdcp_fast import kernels
from sdcp_fast.cache import MLC, ObjectUnavailable, object_uri
from sdcp_fast.commitlog import Fenced, PreconditionFailed, length_of
from sdcp_fast.model.interfaces import Drafter, ScoreRequest, TargetScorer
from sdcp_fast.protocol import (
    Action,
    Assignment,
    Contract,
    Proposal,
    Sampling,
    SdcpProblem,
    SessionOpen,
    Status,
    Verdict,
    extend_digest,
)
from sdcp_fast.protocol.drafter import AcceptanceEstimator, DrafterSession
from sdcp_fast.protocol.messages import ROLE_DRAFTER, RULE_GREEDY
from sdcp_fast.protocol.router import RoutedSession, StatusTable, after_open, confirmed, on_event
from sdcp_fast.protocol.session import (
    AppendNeeded,
    RoundDone,
    ScoreNeeded,
    State,
    VerifierSession,
)

VERIFIER = "inproc://verifier"
LEASE_TTL = 30.0
STATUS_TTL_MS = 10_000


@dataclass(frozen=True)
class SessionSpec:
    """What a front end asks for; the engine turns it into a contract."""

    prompt: Sequence[int]
    max_new: int = 64
    rule: int = RULE_GREEDY
    sampling: Sampling | None = None
    m_max: int = 8
    m_init: int = 4
    stop: tuple[int, ...] = ()
    low_rounds: int = 2
    low_ratio: int | None = 25
    fallback: tuple[int, ...] = (Action.REDUCE, Action.SWITCH, Action.SELF_DECODE, Action.FAIL)
    self_load: int | None = 50
    self_max: int | None = 8
    drafters: tuple[str, ...] | None = None  # names of permitted drafters (None: any)


@dataclass(frozen=True)
class RoundRecord:
    """One committed round, as a researcher or the demo wants to see it."""

    session: int
    round: int
    drafter: str | None  # None for a self-decoded round
    proposed: int
    accepted: int
    emitted: tuple[int, ...]
    action: Action
    m_cap: int
    digest: bytes


@dataclass
class SessionResult:
    session: bytes
    prompt: tuple[int, ...]
    tokens: list[int] = field(default_factory=list)
    finish: Action | None = None
    rounds: int = 0
    proposed: int = 0
    accepted: int = 0
    self_decoded: int = 0
    digest: bytes = b""
    chain_ok: bool = False
    problems: list[str] = field(default_factory=list)

    @property
    def acceptance(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0


@dataclass
class _Live:
    index: int
    spec: SessionSpec
    verifier: VerifierSession
    routed: RoutedSession
    result: SessionResult
    log_etag: str
    drafter: DrafterSession | None = None
    work: ScoreNeeded | None = None
    q_probs: torch.Tensor | None = None
    lease: str | None = None
    drafter_name: str | None = None


def model_digest(name: str) -> bytes:
    """A stand-in hash32 for components that have no weights to hash (toys, n-gram)."""
    return hashlib.sha256(f"sdcp-fast:{name}".encode()).digest()


class Engine:
    """Drives many sessions round by round; one scoring pass per step covers all of them."""

    def __init__(
        self,
        scorer: TargetScorer,
        drafters: Sequence[Drafter],
        mlc: MLC,
        *,
        target_digest: bytes,
        tokenizer_digest: bytes,
        drafter_digests: dict[str, bytes] | None = None,
        verifier_load: int = 30,
        backend: str = "auto",
        seed: int = 0,
        adaptive_m: bool = True,
        on_round: Callable[[RoundRecord], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.scorer = scorer
        self.drafters = {d.name: d for d in drafters}
        self.mlc = mlc
        self.target_digest = target_digest
        self.tokenizer_digest = tokenizer_digest
        self.drafter_digests = drafter_digests or {d.name: model_digest(d.name) for d in drafters}
        self.verifier_load = verifier_load
        self.backend = backend
        self.on_round = on_round
        self.clock = clock
        self.table = StatusTable()
        self.seed = seed
        # The §6.2 choice of M uses measured draft and verify times; without it M is the
        # current limit, so that seeded runs repeat exactly.
        self.adaptive_m = adaptive_m
        self.generator = torch.Generator().manual_seed(seed)
        self.target_passes = 0
        self._t_draft = 1e-3  # EWMA seconds per drafted token, for the choice of M (§6.2)
        self._t_verify = 1e-2  # EWMA seconds per verification pass
        self._live: list[_Live] = []
        self._acceptance = {name: AcceptanceEstimator() for name in self.drafters}
        for name, digest in self.drafter_digests.items():
            self.table.register_model(name, digest)

    # -- set-up -----------------------------------------------------------------------------

    def _contract(self, spec: SessionSpec, scope: bytes) -> Contract:
        permitted = None
        if spec.drafters is not None:
            permitted = tuple(self.drafter_digests[n] for n in spec.drafters)
        return Contract(
            target=self.target_digest, tokenizer=self.tokenizer_digest, rule=spec.rule,
            m_max=spec.m_max, max_new=spec.max_new, stop=tuple(spec.stop), low_rounds=spec.low_rounds,
            fallback=tuple(int(a) for a in spec.fallback), drafters=permitted, sampling=spec.sampling,
            low_ratio=spec.low_ratio, self_load=spec.self_load, self_max=spec.self_max, scope=scope,
        )

    def _report_status(self, now: float) -> None:
        busy: dict[str, int] = {}
        for live in self._live:
            if live.drafter_name is not None and not live.verifier.closed:
                busy[live.drafter_name] = busy.get(live.drafter_name, 0) + 1
        for name in self.drafters:
            self.table.report(self._status(name, busy.get(name, 0)), now)

    def _status(self, name: str, queue: int = 0) -> Status:
        # What a drafter instance would report (§5.2 status): the router prefers low load and
        # queue, then high recent acceptance (§6.1).
        return Status(instance=name, role=ROLE_DRAFTER, load=min(100, queue * 10), queue=queue,
                      accept_milli=self._acceptance[name].accept_milli, ttl_ms=STATUS_TTL_MS)

    def _open(self, index: int, spec: SessionSpec, now: float) -> _Live:
        # Derived from the engine's seed so that seeded runs are reproducible end to end
        # (rule 2's verifier randoms depend on the session id, §6.4).
        session = hashlib.sha256(f"sdcp-fast/session/{self.seed}/{index}".encode()).digest()[:16]
        scope = hashlib.sha256(b"sdcp-fast-inprocess").digest()[:16]
        contract = self._contract(spec, scope)
        log_ref = object_uri(scope, session, "commit_log")
        message = SessionOpen(session=session, epoch=1, contract=contract, prompt=tuple(spec.prompt),
                              commit_log=log_ref)
        verifier, state = VerifierSession.open(message, target_digest=self.target_digest)
        routed = RoutedSession(session=session, epoch=1, contract=contract, prompt=tuple(spec.prompt),
                               commit_log=log_ref, verifier=VERIFIER, round=0, committed=0,
                               digest=state.digest, m_init=spec.m_init)
        log = self.mlc.commit_log(log_ref)
        result = SessionResult(session=session, prompt=tuple(spec.prompt), digest=state.digest)
        live = _Live(index, spec, verifier, routed, result, log.read().etag)
        assignment = after_open(routed, state, self.table, now)
        if assignment is not None:
            self._assign(live, assignment)
        return live

    def _assign(self, live: _Live, assignment: Assignment) -> None:
        # PUT sessions/{id}/drafter first; the drafter's copy carries the verifier's answer (§6.1).
        state = live.verifier.assign(assignment)
        assignment = confirmed(live.routed, state)
        if live.drafter_name is not None and live.drafter_name != assignment.drafter:
            self.drafters[live.drafter_name].release(live.verifier.session)
        live.drafter = DrafterSession(assignment)
        live.drafter_name = assignment.drafter

    # -- one step ---------------------------------------------------------------------------

    def run(self, specs: Sequence[SessionSpec]) -> list[SessionResult]:
        now = self.clock()
        self._live = []
        self._report_status(now)
        self._live = [self._open(i, spec, now) for i, spec in enumerate(specs)]
        while any(not live.verifier.closed for live in self._live):
            if not self.step():
                # Nothing can move: open sessions without a live drafter. In-process no
                # drafter will come back, so they end here, their committed output intact.
                for live in self._live:
                    if not live.verifier.closed:
                        live.result.problems.append("no-live-drafter")
                break
        for live in self._live:
            self.scorer.release(live.verifier.session)
            if live.drafter_name is not None:
                self.drafters[live.drafter_name].release(live.verifier.session)
            live.result.chain_ok = (
                extend_digest(live.verifier.digest0, live.result.tokens) == live.result.digest
            )
        return [live.result for live in self._live]

    def step(self) -> bool:
        """One scoring pass over every session that has work; False if none had any."""
        now = self.clock()
        self._report_status(now)
        waiting = [live for live in self._live if not live.verifier.closed and self._prepare(live, now)]
        if not waiting:
            return any(live.drafter is not None and live.drafter.stopped is None
                       for live in self._live if not live.verifier.closed)
        t0 = self.clock()
        logits = self.scorer.score([
            ScoreRequest(live.verifier.session, live.work.context, live.work.proposed)  # type: ignore[union-attr]
            for live in waiting
        ])
        self.target_passes += 1
        results = self._verify(waiting, logits)
        self._t_verify = 0.8 * self._t_verify + 0.2 * (self.clock() - t0)
        for live, (accepted, token) in zip(waiting, results, strict=True):
            self._commit(live, accepted, token, now)
        return True

    def _prepare(self, live: _Live, now: float) -> bool:
        """Get the session's next ScoreNeeded: a self-decoded position or a drafter's proposal."""
        verifier = live.verifier
        live.work, live.q_probs = None, None
        if verifier.state is State.SELF_DECODING:
            live.work = verifier.self_decode()
            return True
        record = live.drafter
        if record is None or record.stopped is not None:
            return False
        name = record.assignment.drafter
        if record.outstanding is not None:  # its round was dropped: send it again (§6.9)
            return self._submit(live, record.retry(self._status(name)), now)
        drafter = self.drafters[name]
        m = record.choose_m(self._t_draft, self._t_verify) if self.adaptive_m else record.limit
        sampling = verifier.sampling_for(record.round + 1) or Sampling()
        t0 = self.clock()
        committed = (*verifier.prompt, *live.result.tokens)
        draft = drafter.propose(
            verifier.session, committed, m, rule=verifier.contract.rule,
            temperature_milli=sampling.temperature_milli, top_k=sampling.top_k,
            top_p_milli=sampling.top_p_milli, generator=self.generator,
        )
        self._t_draft = 0.8 * self._t_draft + 0.2 * (self.clock() - t0) / max(1, len(draft.tokens))
        q_ref = None
        if draft.q_rows is not None:
            # The drafter leaves its rows in the MLC and holds a lease until the verdict (§6.2).
            scope = verifier.contract.scope or bytes(16)
            q_ref = object_uri(scope, verifier.session, "q_rows", record.round + 1)
            live.lease = self.mlc.put(q_ref, draft.q_rows.contiguous(), lease_ttl=LEASE_TTL).lease
        proposal = record.propose(draft.tokens, self._status(name), q_rows=q_ref)
        return self._submit(live, proposal, now)

    def _submit(self, live: _Live, proposal: Proposal, now: float) -> bool:
        verifier = live.verifier
        try:
            work = verifier.receive_proposal(proposal, client=proposal.drafter, now=now)
            if not isinstance(work, ScoreNeeded):  # a replayed verdict or a pending round
                return False
            if work.needs_q:
                vocab = self.scorer.vocab_size
                try:
                    # One copy out of the cache: the core reads q(x) from it, the kernels the rows.
                    raw = bytearray(self.mlc.get(proposal.q_rows)) if proposal.q_rows else None
                except ObjectUnavailable:
                    raw = None  # the core answers sdcp-q-unavailable and commits nothing (§6.3)
                uniforms = verifier.provide_q(q_rows=raw, vocab=vocab)
                assert raw is not None
                live.q_probs = torch.frombuffer(raw, dtype=torch.float32).view(-1, vocab)
                work = replace(work, uniforms=uniforms)
        except SdcpProblem as problem:
            live.result.problems.append(problem.suffix)
            self._release_lease(live)
            assert live.drafter is not None
            live.drafter.on_problem(problem)
            return False
        live.work = work
        return True

    # -- verification through the kernels ---------------------------------------------------

    def _verify(self, waiting: list[_Live], logits: list[torch.Tensor]) -> list[tuple[int, int]]:
        out: list[tuple[int, int]] = [(0, 0)] * len(waiting)
        greedy = [i for i, live in enumerate(waiting) if live.verifier.contract.rule == RULE_GREEDY]
        sampled = [i for i, live in enumerate(waiting) if live.verifier.contract.rule != RULE_GREEDY]
        if greedy:
            rows, tokens, cu = self._ragged([waiting[i] for i in greedy], [logits[i] for i in greedy])
            accepted, emitted = kernels.verify_greedy(rows, tokens, cu, backend=self.backend)
            for j, i in enumerate(greedy):
                a = int(accepted[j])
                out[i] = (a, int(emitted[j, a]))
        if sampled:
            lives = [waiting[i] for i in sampled]
            rows, tokens, cu = self._ragged(lives, [logits[i] for i in sampled])
            vocab = rows.shape[1]
            q = torch.cat([
                live.q_probs if live.q_probs is not None else torch.zeros(0, vocab) for live in lives
            ])
            m_max = int((cu[1:] - cu[:-1]).max())
            uniforms = torch.zeros(len(lives), m_max + 1, 2, dtype=torch.float64)
            for j, live in enumerate(lives):
                u = live.work.uniforms  # type: ignore[union-attr]
                assert u is not None
                uniforms[j, : len(u.accept), 0] = torch.tensor(u.accept, dtype=torch.float64)
                uniforms[j, : len(u.draw), 1] = torch.tensor(u.draw, dtype=torch.float64)
            profile = [live.work.sampling or Sampling() for live in lives]  # type: ignore[union-attr]
            temperature = torch.tensor([1000 if s.temperature_milli is None else s.temperature_milli
                                        for s in profile])
            top_k = torch.tensor([s.top_k or 0 for s in profile])
            top_p = torch.tensor([s.top_p_milli or 0 for s in profile])
            accepted, emitted, bad = kernels.verify_speculative(
                rows, temperature, top_k, top_p, q, tokens, cu, uniforms, backend=self.backend)
            for j, i in enumerate(sampled):
                if bool(bad[j]):  # the core checked q(x) > 0 already; this would be a kernel bug
                    raise RuntimeError("kernel flagged a proposal the core accepted")
                a = int(accepted[j])
                out[i] = (a, int(emitted[j, a]))
        return out

    @staticmethod
    def _ragged(lives: list[_Live], logits: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        proposed = [live.work.proposed for live in lives]  # type: ignore[union-attr]
        cu = torch.tensor([0, *accumulate(len(p) for p in proposed)], dtype=torch.int64)
        tokens = torch.tensor([t for p in proposed for t in p], dtype=torch.int64)
        return torch.cat(logits).float(), tokens, cu

    # -- commit -----------------------------------------------------------------------------

    def _commit(self, live: _Live, accepted: int, token: int, now: float) -> None:
        verifier = live.verifier
        work = live.work
        assert work is not None
        append: AppendNeeded = verifier.complete_scoring(accepted, token, load=self.verifier_load)
        log = self.mlc.commit_log(live.routed.commit_log)
        try:
            live.log_etag = log.append(append.record, live.log_etag)
        except Fenced as problem:  # a newer epoch owns the log: discard, stop serving (§6.3)
            live.result.problems.append(problem.suffix)
            verifier.append_done(ok=False, fenced=True)
            self._release_lease(live)
            return
        except PreconditionFailed as problem:  # the round is dropped; re-read and retry it
            live.result.problems.append(problem.suffix)
            verifier.append_done(ok=False)
            live.log_etag = log.read(length_of(live.log_etag)).etag
            return
        done = verifier.append_done(ok=True)
        assert isinstance(done, RoundDone)
        self._release_lease(live)
        self._record(live, work, done.verdict)
        if not work.self_decoded and live.drafter is not None:
            live.drafter.on_verdict(done.verdict)
        for event in done.events:
            assignment = on_event(live.routed, event, self.table, now)
            if assignment is not None and not verifier.closed:
                self._assign(live, assignment)

    def _record(self, live: _Live, work: ScoreNeeded, verdict: Verdict) -> None:
        result = live.result
        result.tokens.extend(verdict.emitted)
        result.digest = verdict.digest
        result.rounds += 1
        if work.self_decoded:
            result.self_decoded += len(verdict.emitted)
        else:
            result.proposed += len(work.proposed)
            result.accepted += verdict.accepted
            if live.drafter_name is not None:
                self._acceptance[live.drafter_name].update(verdict.accepted, len(work.proposed))
        if verdict.action in (Action.FINISH, Action.FAIL):
            result.finish = verdict.action
        if self.on_round is not None:
            self.on_round(RoundRecord(
                session=live.index, round=verdict.round,
                drafter=None if work.self_decoded else live.drafter_name,
                proposed=len(work.proposed), accepted=verdict.accepted, emitted=verdict.emitted,
                action=verdict.action, m_cap=verdict.m_cap, digest=verdict.digest,
            ))

    def _release_lease(self, live: _Live) -> None:
        if live.lease is not None:
            self.mlc.release(live.lease)
            live.lease = None

