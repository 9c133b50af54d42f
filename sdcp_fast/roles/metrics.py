"""Prometheus metrics of the roles (``GET metrics`` on each role's routes).

Every role instance has its own :class:`~prometheus_client.CollectorRegistry`, so several
roles in one process (the in-process engine, tests) keep separate counts and never collide
in the global registry. The roles call one hook per event; this module knows the names.

Names (all prefixed ``sdcp_``):

- every role: ``problems_total{type}`` (problems answered, by Table 2 suffix)
- verifier: ``rounds_total``, ``proposed_tokens_total``, ``accepted_tokens_total``,
  ``emitted_tokens_total``, ``self_decoded_rounds_total``, ``escalations_total{action}``,
  ``verdict_latency_seconds`` (histogram: proposal received to verdict released),
  ``batch_size`` (histogram: sessions per scoring pass), ``pass_phase_seconds{phase}`` (histogram:
  a scoring pass's time by phase, :data:`PASS_PHASES`), ``mlc_q_rows_total{result="hit"|"miss"}``,
  ``target_kv_published_total`` / ``target_kv_published_bytes_total`` /
  ``target_kv_publish_failures_total`` (pages of the committed prefix written to the MLC),
  ``resumes_total{kv="pages"|"cold", reason}`` (resumed opens, §6.9, and whether they imported
  pages; ``reason`` of a cold one: ``none`` named, ``unavailable``, ``refused``,
  ``unsupported`` by the scorer), ``resumed_kv_positions_total`` (positions imported)
- drafter: ``proposals_total``, ``proposal_retries_total``, ``drafted_tokens_total``
- router: ``sessions_opened_total``, ``assignments_total``, ``failovers_total``
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily

from sdcp_fast.protocol import Action, SdcpProblem
from sdcp_fast.transport.base import Request, Response

# Verdict latency: from a fraction of a millisecond (trivial scorer) to seconds (a large
# target on a busy GPU).
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
# Where a scoring pass's time goes, in the order a pass meets them: its batch waiting for the
# proposals still owed (gather), the target and the kernels (score), the core's commit records
# (commit), the commit log's group append (append: a round trip to the MLC and its flush), the
# verdicts and outputs released (release). Their sum is a pass's length; which one dominates
# says what to make cheaper next (docs/measurements.md, "Where a pass's time goes").
PASS_PHASES = ("gather", "score", "commit", "append", "release")
_PLAIN = frozenset({int(Action.CONTINUE), int(Action.FINISH)})  # a verdict's actions that are no escalation


class RoleMetrics:
    """The metrics every role has; :meth:`mount` serves them at ``GET metrics``."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.problems = Counter("sdcp_problems", "Problems answered, by type (Table 2 suffix)", ["type"],
                                registry=self.registry)

    @classmethod
    def mount(cls, routes: Any) -> Any:
        """A new instance, served from ``routes`` (a :class:`~sdcp_fast.roles.wire.Routes`),
        which also reports to it every problem it answers."""
        metrics = cls()
        routes.add("GET", r"metrics", metrics.expose)
        if hasattr(routes, "on_problem"):
            routes.on_problem = metrics.problem
        return metrics

    def problem(self, problem: SdcpProblem) -> None:
        self.problems.labels(problem.suffix).inc()

    async def expose(self, request: Request) -> Response:
        return Response(200, generate_latest(self.registry), {"content-type": CONTENT_TYPE_LATEST})

    def text(self) -> str:
        return generate_latest(self.registry).decode()


class VerifierMetrics(RoleMetrics):
    def __init__(self) -> None:
        super().__init__()
        r = self.registry
        self.rounds = Counter("sdcp_rounds", "Rounds committed", registry=r)
        self.self_decoded = Counter("sdcp_self_decoded_rounds", "Rounds the verifier decoded itself", registry=r)
        self.proposed = Counter("sdcp_proposed_tokens", "Draft tokens proposed in committed rounds", registry=r)
        self.accepted = Counter("sdcp_accepted_tokens", "Draft tokens accepted", registry=r)
        self.emitted = Counter("sdcp_emitted_tokens", "Tokens committed (accepted plus the verifier's)",
                               registry=r)
        self.escalations = Counter("sdcp_escalations", "Verdicts whose action is not continue, by action",
                                   ["action"], registry=r)
        self.latency = Histogram("sdcp_verdict_latency_seconds", "Proposal received to verdict released",
                                 buckets=LATENCY_BUCKETS, registry=r)
        self.batch_size = Histogram("sdcp_batch_size", "Sessions per scoring pass", buckets=BATCH_BUCKETS,
                                    registry=r)
        self.pass_phase = Histogram("sdcp_pass_phase_seconds", "A scoring pass's time by phase: gather, score, "
                                    "commit, append, release", ["phase"], buckets=LATENCY_BUCKETS, registry=r)
        self._phases = {name: self.pass_phase.labels(name) for name in PASS_PHASES}
        self.q_rows = Counter("sdcp_mlc_q_rows", "Draft-row reads from the MLC, by result", ["result"],
                              registry=r)
        self._q_read: dict[bool, Counter] = {}  # each result's child, made at its first read

        self.kv_pages = Counter("sdcp_target_kv_published", "Target KV page sets written to the MLC", registry=r)
        self.kv_bytes = Counter("sdcp_target_kv_published_bytes", "Bytes of target KV pages written", registry=r)
        self.kv_failures = Counter("sdcp_target_kv_publish_failures", "Target KV publishes that failed",
                                   registry=r)
        self.resumes = Counter("sdcp_resumes", "Resumed opens (§6.9), by whether target KV pages were imported",
                               ["kv", "reason"], registry=r)
        self.resumed_positions = Counter("sdcp_resumed_kv_positions", "Positions imported from target KV pages",
                                         registry=r)

    def round(self, verdict: Any, proposed: int, started: float | None) -> None:
        """A committed round; ``started`` (perf_counter) is None for a self-decoded one."""
        self.rounds.inc()
        self.emitted.inc(len(verdict.emitted))
        action = Action.parse(int(verdict.action))
        # A self-decoded round's verdict says self_decode while the period goes on: not an escalation.
        if action not in (Action.CONTINUE, Action.FINISH) and started is not None:
            self.escalations.labels(action.name.lower()).inc()
        if started is None:
            self.self_decoded.inc()
            return
        self.proposed.inc(proposed)
        self.accepted.inc(verdict.accepted)
        self.latency.observe(time.perf_counter() - started)

    def pass_committed(self, done: list[tuple[Any, int, float | None]]) -> None:
        """The rounds one pass committed, ``(verdict, proposed, latency)`` each (the latency in
        seconds as the verdict was released, None for a self-decoded round), counted as
        :meth:`round` counts them, with one increment per counter for the pass."""
        proposed = accepted = emitted = self_decoded = 0
        for verdict, m, latency in done:
            emitted += len(verdict.emitted)
            if latency is None:
                self_decoded += 1
                continue
            if verdict.action not in _PLAIN:
                self.escalations.labels(Action.parse(int(verdict.action)).name.lower()).inc()
            proposed += m
            accepted += verdict.accepted
            self.latency.observe(latency)
        for counter, amount in ((self.rounds, len(done)), (self.emitted, emitted), (self.proposed, proposed),
                                (self.accepted, accepted), (self.self_decoded, self_decoded)):
            if amount:
                counter.inc(amount)

    def batch(self, size: int) -> None:
        self.batch_size.observe(size)

    def phase(self, name: str, seconds: float) -> None:
        """A pass spent ``seconds`` in phase ``name`` (one of :data:`PASS_PHASES`)."""
        self._phases[name].observe(seconds)

    def phase_totals(self) -> dict[str, tuple[float, float]]:
        """Each phase's observations and seconds so far (what ``GET metrics`` shows as its
        ``_count`` and ``_sum``)."""
        out = {name: [0.0, 0.0] for name in PASS_PHASES}
        for sample in (s for family in self.pass_phase.collect() for s in family.samples):
            if sample.name.endswith(("_count", "_sum")):
                out[sample.labels["phase"]][0 if sample.name.endswith("_count") else 1] = sample.value
        return {name: (n, total) for name, (n, total) in out.items()}

    def q_read(self, hit: bool) -> None:
        # Every rule-2 round: a child kept, not looked up by its label each time (~2 us).
        child = self._q_read.get(hit)
        if child is None:
            child = self._q_read[hit] = self.q_rows.labels("hit" if hit else "miss")
        child.inc()

    def kv_published(self, size: int) -> None:
        self.kv_pages.inc()
        self.kv_bytes.inc(size)

    def kv_publish_failed(self) -> None:
        self.kv_failures.inc()

    def resume(self, kv: str, reason: str, *, positions: int = 0) -> None:
        self.resumes.labels(kv, reason).inc()
        self.resumed_positions.inc(positions)


class _FirstTries:
    """``sdcp_proposals`` and ``sdcp_drafted_tokens`` read from the drafter's plain counts at
    each scrape: counted once per round, where a Counter takes two locks per round."""

    def __init__(self, metrics: DrafterMetrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[CounterMetricFamily]:
        yield CounterMetricFamily("sdcp_proposals", "Proposals sent (first tries)", value=self.metrics.proposals)
        yield CounterMetricFamily("sdcp_drafted_tokens", "Draft tokens proposed", value=self.metrics.drafted)


class DrafterMetrics(RoleMetrics):
    def __init__(self) -> None:
        super().__init__()
        r = self.registry
        self.proposals = 0  # first tries
        self.drafted = 0  # their tokens
        r.register(_FirstTries(self))
        self.retries = Counter("sdcp_proposal_retries", "Proposals sent again (§6.9 lost messages)", registry=r)
        self.store_retries = Counter("sdcp_store_retries", "q-row puts tried again (the MLC was unreachable)",
                                     registry=r)

    def proposal(self, tokens: int, attempt: int) -> None:
        if attempt:
            self.retries.inc()
        else:
            self.proposals += 1
            self.drafted += tokens


class RouterMetrics(RoleMetrics):
    def __init__(self) -> None:
        super().__init__()
        r = self.registry
        self.sessions = Counter("sdcp_sessions_opened", "Sessions opened", registry=r)
        self.assignments = Counter("sdcp_assignments", "Drafter assignments made", registry=r)
        self.failovers = Counter("sdcp_failovers", "Verifier fail-overs (§6.9)", registry=r)
