"""Shared pieces of the role tests: identities, a fake clock, and a verifier on an in-process
network that a test calls as a router, a drafter or a stranger would.

Everything goes through the roles' handlers as SDCP messages in bytes, built and decoded by
:class:`~sdcp_fast.roles.wire.SdcpClient`; the toy target scores (no mocks of the core).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from typing import Any, TypeVar

import torch

from sdcp_fast.cache import object_uri
from sdcp_fast.deploy.local import model_digest
from sdcp_fast.model.interfaces import ScoreRequest
from sdcp_fast.model.toy import ToyDrafter, ToyTarget, encode
from sdcp_fast.protocol import (
    Action,
    Assignment,
    Contract,
    Proposal,
    Sampling,
    SdcpProblem,
    SessionOpen,
    SessionState,
    Status,
    Verdict,
    contract_digest,
    prefix_digest,
)
from sdcp_fast.protocol.messages import ROLE_DRAFTER, RULE_GREEDY, RULE_SPECULATIVE
from sdcp_fast.protocol.peer import Peer, PeerRole
from sdcp_fast.roles.drafter import DrafterRole
from sdcp_fast.roles.router import RouterRole
from sdcp_fast.roles.verifier import RoundInfo, VerifierConfig, VerifierRole
from sdcp_fast.roles.wire import Routes, SdcpClient
from sdcp_fast.store import embedded
from sdcp_fast.transport.base import Request, Response
from sdcp_fast.transport.inprocess import InProcessNetwork

T = TypeVar("T")

SCOPE = hashlib.sha256(b"tests/roles").digest()[:16]
TARGET = model_digest("toy-target")
TOKENIZER = model_digest("toy-words")
ROUTER = "inproc://router/"
VERIFIER = "inproc://verifier/"
STANDBY = "inproc://standby/"
DRAFTER = "inproc://drafter/a/"
OTHER = "inproc://drafter/b/"

ROUTER_PEER = Peer(ROUTER, PeerRole.ROUTER)
VERIFIER_PEER = Peer(VERIFIER, PeerRole.VERIFIER)
DRAFTER_PEER = Peer(DRAFTER, PeerRole.DRAFTER)
OTHER_PEER = Peer(OTHER, PeerRole.DRAFTER)
PROMPT = tuple(encode("the verifier commits"))


def sid(n: int) -> bytes:
    return hashlib.sha256(f"tests/roles/session/{n}".encode()).digest()[:16]


def run(coro: Awaitable[T], timeout: float = 20.0) -> T:
    """Run one scenario; a hang fails the test instead of the suite."""
    async def bounded() -> T:
        return await asyncio.wait_for(coro, timeout)
    return asyncio.run(bounded())


class Clock:
    """A clock the test advances by hand (status expiry, §6.1/§6.9)."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def contract(rule: int = RULE_GREEDY, *, max_new: int = 32, m_max: int = 8, sampling: Sampling | None = None,
             target: bytes = TARGET, **kw: Any) -> Contract:
    if rule == RULE_SPECULATIVE and sampling is None:
        sampling = Sampling(temperature_milli=1000, seed=5)
    fields: dict[str, Any] = dict(
        target=target, tokenizer=TOKENIZER, rule=rule, m_max=m_max, max_new=max_new, stop=(),
        low_rounds=2, fallback=(int(Action.REDUCE), int(Action.SWITCH), int(Action.FAIL)), sampling=sampling,
        low_ratio=25, scope=SCOPE)
    fields.update(kw)
    return Contract(**fields)


def session_open(session: bytes, c: Contract, *, epoch: int = 1, prompt: Sequence[int] | str = PROMPT,
                 **kw: Any) -> SessionOpen:
    return SessionOpen(session=session, epoch=epoch, contract=c, prompt=prompt if isinstance(prompt, str) else tuple(prompt),
                       commit_log=object_uri(SCOPE, session, "commit_log"), **kw)


def assignment(opened: SessionOpen, state: SessionState, *, drafter: str = DRAFTER, verifier: str = VERIFIER,
               m_init: int = 4, **kw: Any) -> Assignment:
    return Assignment(session=opened.session, epoch=opened.epoch, contract=opened.contract, verifier=verifier,
                      drafter=drafter, prompt=opened.prompt, round=state.round, committed=state.committed,
                      digest=state.digest, m_init=m_init, **kw)


def status(instance: str = DRAFTER, role: int = ROLE_DRAFTER, *, load: int = 0, queue: int = 0,
           ttl_ms: int = 10_000) -> Status:
    return Status(instance=instance, role=role, load=load, queue=queue, ttl_ms=ttl_ms)


def proposal(state: SessionState | Verdict, tokens: Sequence[int], *, drafter: str = DRAFTER,
             q_rows: str | None = None, **kw: Any) -> Proposal:
    fields: dict[str, Any] = dict(session=state.session, epoch=state.epoch, round=state.round + 1, drafter=drafter,
                                  base=state.committed, base_digest=state.digest, tokens=tuple(tokens),
                                  status=status(drafter), q_rows=q_rows)
    fields.update(kw)
    return Proposal(**fields)


def d0(c: Contract, prompt: Sequence[int] = PROMPT) -> bytes:
    return prefix_digest(contract_digest(c), tuple(prompt))


def greedy(target: ToyTarget, context: Sequence[int], n: int) -> list[int]:
    """Target-only greedy decoding (rule 1's output), for choosing proposals that are accepted."""
    out: list[int] = []
    for _ in range(n):
        row = target.score([ScoreRequest(b"g" * 16, [*context, *out], [])])[0][0]
        out.append(int(torch.argmax(row)))
    return out


def problem_of(exc: BaseException) -> tuple[str, int]:
    assert isinstance(exc, SdcpProblem), exc
    return exc.suffix, exc.status


class CountingScorer:
    """The toy target, recording what it scored; ``on_score`` (if set) runs inside the pass,
    so a test can act while a round is being verified (a fence, a lease count)."""

    def __init__(self, target: ToyTarget | None = None) -> None:
        self.target = target or ToyTarget()
        self.vocab_size = self.target.vocab_size
        self.scored: list[tuple[bytes, tuple[int, ...]]] = []
        self.on_score: Any = None

    def score(self, batch: Sequence[ScoreRequest]) -> list[torch.Tensor]:
        self.scored.extend((r.session, tuple(r.proposal)) for r in batch)
        if self.on_score is not None:
            self.on_score(batch)
        return self.target.score(batch)

    def release(self, session: bytes) -> None:
        pass


def verifier_config(**settings: Any) -> VerifierConfig:
    """The tests' verifier: VERIFIER on the toy target's digest, reference kernels, no batch
    wait and short output polls, unless ``settings`` say otherwise."""
    defaults: dict[str, Any] = dict(uri=VERIFIER, target_digest=TARGET, backend="reference", batch_wait=0.0,
                                    output_wait=0.05)
    return VerifierConfig(**{**defaults, **settings})


class Rig:
    """A verifier role on an in-process network, with clients for each kind of caller."""

    def __init__(self, root: str, *, scorer: Any = None, **config: Any) -> None:
        self.network = InProcessNetwork()
        self.store = embedded(root)
        self.mlc = self.store.mlc  # the cache itself, for looking at objects directly
        self.scorer = scorer if scorer is not None else CountingScorer()
        self.target = getattr(self.scorer, "target", self.scorer)
        self.rounds: list[RoundInfo] = []
        self.verifier = VerifierRole(self.scorer, verifier_config(**config), mlc=self.store,
                                     transport=self.network.transport(VERIFIER_PEER), on_round=self.rounds.append)
        self.network.register(VERIFIER, self.verifier.handler)
        self.roles: list[Any] = []
        self.router = self.client(ROUTER_PEER)
        self.drafter = self.client(DRAFTER_PEER)
        self.other = self.client(OTHER_PEER)

    def client(self, peer: Peer | None) -> SdcpClient:
        return SdcpClient(self.network.transport(peer))  # type: ignore[arg-type]

    def configure(self, **settings: Any) -> None:
        """Change settings the role reads on each request (``output_wait``), not its parts'."""
        self.verifier.config = replace(self.verifier.config, **settings)

    async def __aenter__(self) -> Rig:
        await self.verifier.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        for role in reversed(self.roles):
            await role.close()
        await self.verifier.close()
        self.store.close()

    async def open(self, session: bytes, c: Contract | None = None, *, m_init: int = 4, drafter: str | None = DRAFTER,
                   **kw: Any) -> tuple[SessionOpen, SessionState]:
        """POST sessions then PUT sessions/{id}/drafter, as the router does (§6.1)."""
        opened = session_open(session, c or contract(), **kw)
        state = await self.router.open_session(VERIFIER, opened)
        if drafter is not None:
            state = await self.router.put_drafter(VERIFIER, assignment(opened, state, drafter=drafter, m_init=m_init))
        return opened, state

    async def drafter_role(self, model: Any = None, *, uri: str = DRAFTER, transport: Any = None,
                           **kw: Any) -> DrafterRole:
        """A drafter role at ``uri`` on this network, speaking as a drafter certificate of ``uri``."""
        role = DrafterRole(model if model is not None else ToyDrafter("good", self.target, 0.8), uri=uri,
                           mlc=self.store, transport=transport or self.network.transport(Peer(uri, PeerRole.DRAFTER)),
                           **kw)
        self.network.register(uri, role.handler)
        self.roles.append(role)
        await role.start()
        return role

    def greedy_after(self, state: SessionState | Verdict, n: int, prompt: Sequence[int] = PROMPT) -> list[int]:
        out = self.output_of(state.session)
        return greedy(self.target, [*prompt, *out], n)

    def output_of(self, session: bytes) -> list[int]:
        return list(self.verifier.sessions.get(session).output(0).tokens)

    def put_q(self, session: bytes, round_: int, rows: torch.Tensor) -> str:
        uri = object_uri(SCOPE, session, "q_rows", round_)
        self.mlc.put(uri, rows.float().contiguous())
        return uri

    def uniform_q(self, session: bytes, round_: int, m: int) -> str:
        return self.put_q(session, round_, torch.full((m, self.scorer.vocab_size), 1.0 / self.scorer.vocab_size))


class Failover:
    """The parts of a fail-over test on one in-process network and one embedded MLC: the toy
    target, a fake clock, verifiers that report to ROUTER, a router that sweeps every 10 ms and
    knows DRAFTER, and DRAFTER proposing a fixed M of 3."""

    def __init__(self, root: str) -> None:
        self.clock = Clock()
        self.network = InProcessNetwork()
        self.mlc = embedded(root)
        self.target = ToyTarget()

    def verifier(self, uri: str, on_round: Any = None, *, register: bool = True) -> VerifierRole:
        """A verifier at ``uri``; ``register=False`` for a test that puts its own handler in front."""
        config = VerifierConfig(uri=uri, target_digest=TARGET, router=ROUTER, backend="reference", batch_wait=0.0,
                                output_wait=0.1)
        role = VerifierRole(self.target, config, mlc=self.mlc,
                            transport=self.network.transport(Peer(uri, PeerRole.VERIFIER)), on_round=on_round)
        if register:
            self.network.register(uri, role.handler)
        return role

    def partition_after(self, uri: str, round_: int) -> tuple[list[RoundInfo], Callable[[RoundInfo], None]]:
        """An ``on_round`` for the verifier at ``uri`` that takes it off the network once it has
        verified ``round_`` (partitioned: it answers nobody from then on), and the list that
        then holds that round's info."""
        killed: list[RoundInfo] = []

        def on_round(info: RoundInfo) -> None:
            if info.round == round_ and not killed:
                killed.append(info)
                self.network.unregister(uri)

        return killed, on_round

    def router(self) -> RouterRole:
        role = RouterRole(uri=ROUTER, mlc=self.mlc, transport=self.network.transport(ROUTER_PEER),
                          target_digest=TARGET, tokenizer_digest=TOKENIZER, scope=SCOPE, clock=self.clock,
                          drafter_models={DRAFTER: b"a" * 32}, sweep_interval=0.01)
        self.network.register(ROUTER, role.handler)
        return role

    def drafter(self) -> DrafterRole:
        role = DrafterRole(ToyDrafter("good", self.target, 0.8), uri=DRAFTER, mlc=self.mlc, router=ROUTER, fixed_m=3,
                           transport=self.network.transport(Peer(DRAFTER, PeerRole.DRAFTER)))
        self.network.register(DRAFTER, role.handler)
        return role


async def until(predicate: Any, *, seconds: float = 10.0) -> None:
    """Let the roles run until ``predicate()`` holds (polled each millisecond)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError("condition never held")
        await asyncio.sleep(0.001)


async def cancel(task: asyncio.Task[Any]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task


class AnsweredNow:
    """A role's handler as the native server calls it: a route answered directly
    (``Routes.answer_now``, a future settled later) takes no request through ``Routes``.
    ``general`` lists the requests that went through the route table; ``tasks`` whether each
    proposal answered directly took a task (a problem answered at once took none)."""

    def __init__(self, routes: Routes) -> None:
        self.routes = routes
        self.general: list[str] = []
        self.tasks: list[bool] = []

    async def __call__(self, request: Request) -> Response:
        answer = self.routes.answer_now(request.method, request.path, request.query, request.body,
                                        request.headers, request.peer)
        if answer is None:
            self.general.append(f"{request.method} {request.path.split('/')[-1]}")
            return await self.routes(request)
        if request.path == "proposals":
            self.tasks.append(isinstance(answer, asyncio.Task))
        if isinstance(answer, Response):
            return answer
        await asyncio.wait([answer])
        return self.routes.settled(answer)
