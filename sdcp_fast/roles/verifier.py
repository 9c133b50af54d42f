"""The verifier role (§6.1, §6.3–§6.8): the resources of Table 1, each a view that decodes
the request, calls the core (:class:`~sdcp_fast.protocol.VerifierSession`) and encodes its
answer, and the parts the views hand work to:

- :mod:`~sdcp_fast.roles.verifier_config`: what it is built from, one config and its parts' context;
- :mod:`~sdcp_fast.roles.verifier_open`: what opening a session reads and sets up;
- :mod:`~sdcp_fast.roles.verifier_batch`: q rows, batches and scoring passes (the kernels
  through :mod:`~sdcp_fast.roles.scoring`);
- :mod:`~sdcp_fast.roles.verifier_commit`: the commit log, then the output and the events;
- :mod:`~sdcp_fast.roles.verifier_kv`: target KV pages, published and imported;
- :mod:`~sdcp_fast.roles.verifier_state`: what is kept per session, attached to the core's
  session in the one :class:`~sdcp_fast.protocol.registry.SessionRegistry`.

Resources: ``POST sessions``, ``PUT sessions/{id}/drafter``, ``POST proposals``,
``GET sessions/{id}/output?from=n``, ``POST sessions/{id}/policy``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from sdcp_fast.model.interfaces import TargetKV, TargetScorer
from sdcp_fast.model.kv_transfer import target_kv_of
from sdcp_fast.protocol import (
    Assignment,
    BadRequest,
    NotAssigned,
    Output,
    Policy,
    Proposal,
    SdcpProblem,
    SessionOpen,
    SessionState,
    StaleEpoch,
    Status,
    UnknownSession,
    Verdict,
    parse_session_path_id,
)
from sdcp_fast.protocol.messages import ROLE_VERIFIER
from sdcp_fast.protocol.peer import Peer, PeerRole, require_role, same_instance
from sdcp_fast.protocol.problems import Busy, Forbidden
from sdcp_fast.protocol.registry import SessionRegistry
from sdcp_fast.protocol.session import Pending, ScoreNeeded, State
from sdcp_fast.roles.load import VerifierLoad
from sdcp_fast.roles.metrics import VerifierMetrics
from sdcp_fast.roles.objects import Objects
from sdcp_fast.roles.verifier_batch import Batcher
from sdcp_fast.roles.verifier_commit import Committer
from sdcp_fast.roles.verifier_config import VerifierConfig, VerifierContext
from sdcp_fast.roles.verifier_kv import KvPublisher
from sdcp_fast.roles.verifier_open import open_objects, serve
from sdcp_fast.roles.verifier_state import Background, Deadlines, LiveSession, Round, RoundInfo
from sdcp_fast.roles.wire import (
    Routes,
    SdcpClient,
    decode_body,
    decode_message,
    report_status_forever,
    routers_of,
    to_every_router,
)
from sdcp_fast.store.interface import Store
from sdcp_fast.transport.base import Request, Transport

__all__ = ["RoundInfo", "VerifierConfig", "VerifierRole"]

log = logging.getLogger("sdcp_fast.verifier")
T = TypeVar("T")

CANCEL_WAIT = 30.0  # seconds a cancel waits for a round already in a scoring pass
# A session's id in a request path, decoded: each output long-poll names its session again,
# every round (a bad id raises each time: nothing is kept for it).
_session_id = functools.lru_cache(maxsize=4096)(parse_session_path_id)


class VerifierRole:
    """Built from one :class:`VerifierConfig`; ``target_kv`` says where target KV pages come
    from ("auto": a scorer with a paged cache; None: nothing is published or imported),
    ``on_round`` observes each committed round."""

    def __init__(self, scorer: TargetScorer, config: VerifierConfig, *, mlc: Store, transport: Transport,
                 clock: Callable[[], float] = time.monotonic, on_round: Callable[[RoundInfo], None] | None = None,
                 target_kv: TargetKV | None | str = "auto") -> None:
        self.scorer, self.config, self.uri = scorer, config, config.uri
        self.client = SdcpClient(transport)
        self.sessions: SessionRegistry[LiveSession] = SessionRegistry()
        self.routes = Routes()
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="verifier") if config.offload else None
        self.context = context = VerifierContext(
            store=mlc, objects=Objects(mlc, self._executor), load=VerifierLoad(config.max_batch),
            metrics=VerifierMetrics.mount(self.routes), background=Background(), clock=clock)
        self.objects, self.load, self.metrics, self.clock = context.objects, context.load, context.metrics, clock
        self._tasks: list[asyncio.Task[None]] = []
        self._deadlines = Deadlines()  # of the output long-polls
        pages = target_kv_of(scorer, config.target_digest) if isinstance(target_kv, str) else target_kv
        self.kv = KvPublisher(pages, config, context)
        self.committer = Committer(config, context, kv=self.kv, client=self.client, on_round=on_round)
        self.batcher = Batcher(scorer, self.sessions, config, context, committer=self.committer)
        self.routes.add("POST", r"sessions", self._post_session)
        self.routes.add_direct("PUT", r"sessions/(?P<sid>[^/]+)/drafter", self._put_drafter)
        # The two requests of every round: answered in a plain call where the server can.
        self.routes.add_direct("POST", r"proposals", self._propose)
        self.routes.add_direct("GET", r"sessions/(?P<sid>[^/]+)/output", self._output)
        self.routes.add("POST", r"sessions/(?P<sid>[^/]+)/policy", self._post_policy)
        self.routes.add("DELETE", r"sessions/(?P<sid>[^/]+)", self._delete_session)  # an extension
        self.routes.add("DELETE", r"sessions/(?P<sid>[^/]+)/drafter", self._delete_drafter)  # an extension

    @property
    def handler(self) -> Routes:
        return self.routes

    @property
    def progress(self) -> float:
        """When a scoring pass last started or a round was committed."""
        return self.batcher.progress

    @property
    def target_passes(self) -> int:
        return self.batcher.target_passes

    # -- life cycle -----------------------------------------------------------------------

    async def start(self) -> None:
        self._tasks.append(asyncio.create_task(self.batcher.run(), name="verifier-batcher"))
        if (router := self.config.router) is not None:
            reports = report_status_forever(self.report_status, self.config.status_ttl_ms, router)
            self._tasks.append(asyncio.create_task(reports, name="verifier-status"))

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await self.context.background.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()
        for live in self.sessions.records():
            self.scorer.release(live.session.session)
            live.waiters.cancel()
        self._deadlines.close()
        if self._executor is not None:
            self._executor.shutdown(wait=False)
        self.kv.close()

    def status(self) -> Status:
        self.load.queue = self.batcher.queued
        return Status(instance=self.uri, role=ROLE_VERIFIER, load=self.load.percent(), queue=self.load.queue,
                      ttl_ms=self.config.status_ttl_ms)

    async def report_status(self) -> None:
        status = self.status()
        await to_every_router(self.config.router, lambda router: self.client.status(router, status))

    def _require_own_router(self, request: Request) -> None:
        """403 unless a router this verifier serves (any router if none is set) sent ``request``."""
        peer = require_role(request.peer, PeerRole.ROUTER)
        routers = routers_of(self.config.router)
        if routers and not (peer.uri is not None and any(same_instance(peer.uri, r) for r in routers)):
            raise Forbidden(f"{peer.uri} is not this verifier's router")

    # -- resources ------------------------------------------------------------------------

    def live(self, sid: str | bytes) -> LiveSession:
        """The role's record of a session it serves (:class:`UnknownSession` if none)."""
        session = _session_id(sid) if isinstance(sid, str) else sid
        live = self.sessions.attached(session)
        if live is None:
            self.sessions.get(session)  # its problem when no session is held under the id
            raise UnknownSession("no such session at this verifier")
        return live

    def _open_sessions(self) -> int:
        return len(self.sessions.open_records())

    async def _post_session(self, request: Request) -> SessionState:
        require_role(request.peer, PeerRole.ROUTER)
        message = decode_body(SessionOpen, request)
        if request.peer is not None and message.commit_log.startswith("file://"):
            # A path on this verifier's own file system is not a remote peer's to name.
            raise BadRequest("commit_log: a file:// log may be named only by an in-process caller")
        most = self.config.max_sessions
        if (message.session not in self.sessions and len(self.sessions) >= most
                and self._open_sessions() >= most):  # walked only near the bound
            raise Busy(f"{most} sessions are open at this verifier")
        prompt, committed = await open_objects(message, self.objects, self.committer)
        if len(prompt if prompt is not None else message.prompt) > self.config.max_prompt:
            raise BadRequest(f"the prompt is over {self.config.max_prompt} tokens")
        previous = self.sessions.attached(message.session)
        if previous is not None and previous.session.epoch < message.epoch:
            # The epoch it replaces ends here: its output, for its readers (the open fences it).
            await self.committer.publish_output(previous)
        session, state = self.sessions.open(message, target_digest=self.config.target_digest,
                                            vocab=self.scorer.vocab_size, prompt_tokens=prompt,
                                            committed_tokens=committed)
        if self.sessions.attached(message.session) is None:  # not served yet
            if previous is not None:  # re-opened at a higher epoch (§6.9): the old one is over
                previous.fail_waiting(StaleEpoch("the session was re-opened at a newer epoch"))
            await serve(self.sessions, session, message, committer=self.committer, kv=self.kv)
            self.batcher.wake.set()
        return state

    def _put_drafter(self, peer: Peer | None, headers: Mapping[str, str], body: bytes, query: Mapping[str, str],
                     groups: dict[str, str]) -> SessionState | asyncio.Future[SessionState]:
        require_role(peer, PeerRole.ROUTER)
        live = self.live(groups["sid"])
        assignment = decode_message(Assignment, headers, body)
        if assignment.session != live.session.session:
            raise BadRequest("assignment is for another session than its path")
        state = live.session.assign(assignment)
        self.batcher.wake.set()
        if state.committed:  # the new drafter learns the prefix from this epoch's object
            return self.context.background.spawn(self._published(live, state))
        return state

    async def _post_policy(self, request: Request, sid: str) -> SessionState:
        require_role(request.peer, PeerRole.ROUTER)
        live = self.live(sid)
        policy = decode_body(Policy, request)
        if policy.session != live.session.session:
            raise BadRequest("policy is for another session than its path")
        return live.session.policy(policy)

    async def _delete_session(self, request: Request, sid: str) -> None:
        """Cancel (docs/interpretations.md "Cancelling a session"): the router that routes this
        verifier ends a session whose client went away. Queued rounds are dropped unscored, a
        round in a pass ends with it, then the session and its KV cache are freed; its
        drafter's next proposal gets sdcp-unknown-session."""
        self._require_own_router(request)
        live = self.live(sid)
        session = live.session
        gone = UnknownSession("the session was cancelled by its router")
        self.sessions.remove(session.session)  # from now on no proposal reaches it
        self.batcher.withdraw(live, gone)
        deadline = self.clock() + CANCEL_WAIT
        while (session.state in (State.SCORING, State.COMMITTING) or live.prefill.in_pass) and self.clock() < deadline:
            await asyncio.sleep(0.01)  # a round or a prefill chunk in a pass: it finishes first
        self.scorer.release(session.session)
        live.fail_waiting(gone)
        log.info("session %s: cancelled by the router at %d output tokens", session.session.hex(), session.committed)
        return None

    async def _delete_drafter(self, request: Request, sid: str) -> SessionState:
        """Take the drafter away (docs/interpretations.md "Taking the drafter away"): the router
        found no live drafter for a stalled session, so the verifier decodes it itself where
        the contract permits; the router's next assignment ends that. Answers the session-state."""
        self._require_own_router(request)
        session = self.live(sid).session
        if session.drop_drafter(load=self.load.percent()):
            log.info("session %s: no live drafter; self-decoding from %d output tokens",
                     session.session.hex(), session.committed)
            self.batcher.wake.set()
        return session.session_state()

    def _output(self, peer: Peer | None, headers: Mapping[str, str], body: bytes, query: Mapping[str, str],
                groups: dict[str, str]) -> Output | asyncio.Future[Output]:
        """``GET sessions/{id}/output?from=n``: the output from ``n`` at once when there is
        some, or a future answered by the commit that releases tokens, the session's end or
        ``output_wait`` seconds, whichever is first."""
        # The router's only (docs/security.md, "Who reads a session's output"): it hands the
        # output to the front end that opened the session; no other peer has a reason to read it.
        require_role(peer, PeerRole.ROUTER)
        live = self.live(groups["sid"])
        raw = query.get("from", "0")
        if not raw.isdigit():
            raise BadRequest("from must be a uint")
        start = int(raw)
        if live.gone is not None:
            raise live.gone
        out = live.session.output(start)
        if out.tokens or out.final or self.config.output_wait <= 0:
            return out
        answer: asyncio.Future[Output] = asyncio.get_running_loop().create_future()
        self._poll(live, start, self.clock() + self.config.output_wait, answer)
        return answer

    def _poll(self, live: LiveSession, start: int, deadline: float, answer: asyncio.Future[Output],
              _woken: object = None) -> None:
        """Answer a waiting output read, or wait again (a reader woken by the session's end, a
        commit or its deadline; a commit of other tokens leaves nothing from ``start`` yet)."""
        if answer.done():
            return
        if live.gone is not None:
            answer.set_exception(live.gone)
            return
        out = live.session.output(start)
        remaining = deadline - self.clock()
        if out.tokens or out.final or remaining <= 0:
            answer.set_result(out)
            return
        reader = live.waiters.reader(self._deadlines, remaining)
        reader.add_done_callback(functools.partial(self._poll, live, start, deadline, answer))

    def _propose(self, peer: Peer | None, headers: Mapping[str, str], body: bytes, query: Mapping[str, str],
                 groups: dict[str, str]) -> Verdict | asyncio.Future[Verdict]:
        """``POST proposals``: a recorded verdict at once; else the future of the round's verdict,
        settled by the pass that commits it (a rule-2 round's rows read over the network, an
        identical request being verified and a problem that publishes the output first take a
        task)."""
        if peer is not None and not peer.is_(PeerRole.DRAFTER):
            # §6.3 Authorization: a client that is not the assigned drafter (a router's or any
            # other role's certificate included) is "403 with problem type sdcp-not-assigned".
            raise NotAssigned("only the drafter named in the latest assignment may propose")
        proposal = decode_message(Proposal, headers, body)
        live = self.live(proposal.session)
        client: Peer | str = peer if peer is not None else ""
        try:
            work = live.session.receive_proposal(proposal, client=client, now=self.clock())
        except SdcpProblem as problem:
            if "session_state" not in problem.extra:
                raise
            return self.context.background.spawn(self._published(live, problem))
        if isinstance(work, Verdict):
            return work
        if isinstance(work, Pending):
            return self.context.background.spawn(self._propose_later(client, proposal, live, work))
        round_ = Round(work, live=live, future=asyncio.get_running_loop().create_future(),
                       drafter=live.session.drafter)
        if not work.needs_q:
            return self.batcher.enqueue(round_)
        # Rule 2: rows its drafter's slot on this host holds are read in place, no task.
        direct = self.batcher.enqueue_in_place(round_, proposal)
        if direct is not None:
            return direct
        return self.context.background.spawn(self._propose_later(client, proposal, live, work))

    async def _published(self, live: LiveSession, outcome: T | SdcpProblem) -> T:
        """``outcome`` (returned or raised) once this epoch's output object holds the committed
        output: a drafter learns the tokens behind a problem's session_state, or a newly
        assigned drafter the prefix, from it."""
        await self.committer.publish_output(live)
        if isinstance(outcome, SdcpProblem):
            raise outcome
        return outcome

    async def _propose_later(self, client: Peer | str, proposal: Proposal, live: LiveSession,
                             work: ScoreNeeded | Pending) -> Verdict:
        while isinstance(work, Pending):
            # An identical request is being verified: its verdict answers this one too (§6.3).
            waiter = live.waiters.verdicts.get(work.round)
            if waiter is None:
                await asyncio.sleep(0)
            else:
                with contextlib.suppress(SdcpProblem, asyncio.CancelledError):
                    await asyncio.shield(waiter)
            try:
                again = live.session.receive_proposal(proposal, client=client, now=self.clock())
            except SdcpProblem as problem:
                if "session_state" in problem.extra:  # the drafter will learn the tokens behind it
                    await self.committer.publish_output(live)
                raise
            if isinstance(again, Verdict):
                return again
            work = again
        future: asyncio.Future[Verdict] = asyncio.get_running_loop().create_future()
        return await self.batcher.submit(Round(work, live=live, future=future, drafter=live.session.drafter), proposal)
