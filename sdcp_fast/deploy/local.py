"""SDCP in one process: a router, a verifier and one drafter role per drafter, wired by the
in-process transport. The roles are the services' roles; only the carrier differs.

:class:`Engine` is the one decoding path of ``sdcp-fast generate``, the in-process demo,
its target-only baseline and the model bench: it opens sessions at the router, reads their
output as a front end does, and reports what the verifier committed round by round.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from sdcp_fast.model.contract_digests import drafter_digest, model_digest, scorer_digest
from sdcp_fast.model.interfaces import Drafter, TargetScorer
from sdcp_fast.protocol import Action, contract_digest, extend_digest, prefix_digest
from sdcp_fast.protocol.peer import Peer, PeerRole
from sdcp_fast.roles.drafter import DrafterRole
from sdcp_fast.roles.router import RouterRole, SessionSpec, serving_spec
from sdcp_fast.roles.verifier import RoundInfo, VerifierConfig, VerifierRole
from sdcp_fast.store.interface import Store
from sdcp_fast.transport.inprocess import InProcessNetwork

__all__ = ["Engine", "RoundInfo", "SessionResult", "SessionSpec", "model_digest", "session_id_for"]

ROUTER = "inproc://router/"
VERIFIER = "inproc://verifier/"
# Every role here shares one event loop, so a status goes stale only while a pass holds that
# loop, never because a role died: a long ttl keeps a slow pass (a long prompt on a loaded
# machine) from making the router take its only verifier for dead.
STATUS_TTL_MS = 600_000
STALL_SECONDS = 30.0  # no scoring pass and no commit for this long: the remaining sessions end


def drafter_uri(name: str) -> str:
    return f"inproc://drafter/{hashlib.sha256(name.encode()).hexdigest()[:12]}/"


def session_id_for(seed: int, index: int) -> bytes:
    """The session id a seeded in-process run gives its ``index``-th session: §6.4's randoms
    depend on the session id, so a run repeats exactly only with the same ids."""
    return hashlib.sha256(f"sdcp-fast/session/{seed}/{index}".encode()).digest()[:16]


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
    seconds: float = 0.0

    @property
    def acceptance(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0


class Engine:
    """Runs sessions through the three roles on the in-process transport."""

    def __init__(
        self,
        scorer: TargetScorer,
        drafters: Sequence[Drafter],
        mlc: Store,
        *,
        target_digest: bytes,
        tokenizer_digest: bytes,
        drafter_digests: dict[str, bytes] | None = None,
        backend: str = "auto",
        seed: int = 0,
        adaptive_m: bool = True,
        fixed_m: int | None = None,
        on_round: Callable[[RoundInfo], None] | None = None,
        batch_wait: float = 0.005,
        clock: Callable[[], float] = time.monotonic,
        prefill_chunk: int | None = None,
        prefill_solo: int | None = None,
    ) -> None:
        self.scorer = scorer
        self.drafters = list(drafters)
        self.mlc = mlc
        self.target_digest = target_digest
        self.tokenizer_digest = tokenizer_digest
        self.drafter_digests = drafter_digests or {d.name: drafter_digest(d, scorer) for d in drafters}
        self.backend = backend
        self.seed = seed
        # §6.2's choice of M from measured costs, unless fixed (seeded runs then repeat exactly).
        self.fixed_m = fixed_m if fixed_m is not None or adaptive_m else 64
        # Each committed round, its drafter named by the drafter's name (not its URI).
        self.on_round = on_round
        self.batch_wait = batch_wait
        self.prefill_chunk = prefill_chunk  # None: the verifier's default for the scorer's device
        self.prefill_solo = prefill_solo  # likewise; a pass's budget with no decoding round in it
        self.clock = clock
        self.target_passes = 0
        self.index_of: dict[bytes, int] = {}  # each session of the last run: its index in the specs
        self.verifier: VerifierRole | None = None
        self.router: RouterRole | None = None
        self.drafter_roles: dict[str, DrafterRole] = {}

    def run(self, specs: Sequence[SessionSpec]) -> list[SessionResult]:
        return asyncio.run(self.arun(specs))

    def _spec(self, spec: SessionSpec, index: int) -> SessionSpec:
        drafters = spec.drafters
        if drafters is not None:  # names of this engine's drafters, or model digests
            drafters = tuple(self.drafter_digests[d] if isinstance(d, str) else d for d in drafters)
        session = spec.session if spec.session is not None else session_id_for(self.seed, index)
        return replace(spec, drafters=drafters, session=session)

    def deployment(self, on_round: Callable[[RoundInfo], None] | None = None) -> Deployment:
        """The roles of this engine, wired in process (an async context manager)."""
        return Deployment(self, on_round)

    async def arun(self, specs: Sequence[SessionSpec]) -> list[SessionResult]:
        self.index_of = {}
        results: dict[bytes, SessionResult] = {}
        names = {drafter_uri(d.name): d.name for d in self.drafters}

        def observe(info: RoundInfo) -> None:
            result = results.get(info.session)
            if result is None:
                return
            result.rounds += 1
            result.digest = info.digest
            if info.drafter is None:
                result.self_decoded += len(info.emitted)
            else:
                result.proposed += info.proposed
                result.accepted += info.accepted
            if self.on_round is not None:
                if info.drafter is not None:
                    info = replace(info, drafter=names.get(info.drafter, info.drafter))
                self.on_round(info)

        opened = []
        async with self.deployment(observe) as deployment:
            t0 = time.perf_counter()
            for i, spec in enumerate(specs):
                routed = await deployment.router.open(self._spec(spec, i))
                self.index_of[routed.session] = i
                d0 = prefix_digest(contract_digest(routed.contract), tuple(spec.prompt))
                results[routed.session] = SessionResult(routed.session, tuple(spec.prompt), digest=d0)
                opened.append(routed)
            readers = [asyncio.create_task(self._read(deployment.router, r.session, results[r.session]))
                       for r in opened]
            while not all(task.done() for task in readers):
                await asyncio.wait(readers, timeout=1.0)
                if self.clock() - deployment.verifier.progress > STALL_SECONDS:
                    for task in readers:
                        task.cancel()
                    break
            await asyncio.gather(*readers, return_exceptions=True)
            seconds = time.perf_counter() - t0
            self.target_passes = deployment.verifier.target_passes
            problems = {s: p for role in deployment.drafters.values() for s, p in role.problems.items()}
        out = []
        for routed in opened:
            result = results[routed.session]
            result.seconds = seconds
            d0 = prefix_digest(contract_digest(routed.contract), result.prompt)
            result.chain_ok = extend_digest(d0, result.tokens) == result.digest
            result.problems.extend(problems.get(routed.session, ()))
            out.append(result)
        return out

    @staticmethod
    async def _read(router: RouterRole, session: bytes, result: SessionResult) -> None:
        try:
            async for out in router.output(session):
                result.tokens.extend(out.tokens)
                if out.final:
                    result.finish = out.finish
        except asyncio.CancelledError:
            result.problems.append("stalled")
            raise


class Deployment:
    """A router, a verifier and the drafter roles of an :class:`Engine` on one in-process
    network, started on entry and closed on exit; each role reports its status first, so the
    router knows every instance before the first session is opened."""

    def __init__(self, engine: Engine, on_round: Callable[[RoundInfo], None] | None = None) -> None:
        self.network = network = InProcessNetwork()
        e = engine
        self.router = RouterRole(
            uri=ROUTER, mlc=e.mlc, transport=network.transport(Peer(ROUTER, PeerRole.ROUTER)),
            target_digest=e.target_digest, tokenizer_digest=e.tokenizer_digest,
            drafter_models={drafter_uri(d.name): e.drafter_digests[d.name] for d in e.drafters},
            scope=hashlib.sha256(b"sdcp-fast-inprocess").digest()[:16], clock=e.clock)
        config = VerifierConfig(
            uri=VERIFIER, target_digest=e.target_digest, router=ROUTER, backend=e.backend, batch_wait=e.batch_wait,
            self_decode_idle=None if e.drafters else 0.0, status_ttl_ms=STATUS_TTL_MS,
            prefill_chunk=e.prefill_chunk, prefill_solo=e.prefill_solo)
        self.verifier = VerifierRole(
            e.scorer, config, mlc=e.mlc, transport=network.transport(Peer(VERIFIER, PeerRole.VERIFIER)),
            clock=e.clock, on_round=on_round,
            target_kv=None)  # one verifier: no other one could resume from published pages
        self.drafters = {
            d.name: DrafterRole(d, uri=drafter_uri(d.name), mlc=e.mlc, router=ROUTER, seed=e.seed,
                                fixed_m=e.fixed_m, clock=e.clock, status_ttl_ms=STATUS_TTL_MS,
                                transport=network.transport(Peer(drafter_uri(d.name), PeerRole.DRAFTER)))
            for d in e.drafters
        }
        network.register(ROUTER, self.router.handler)
        network.register(VERIFIER, self.verifier.handler)
        for role in self.drafters.values():
            network.register(role.uri, role.handler)

    @property
    def roles(self) -> list[RouterRole | VerifierRole | DrafterRole]:
        return [self.router, self.verifier, *self.drafters.values()]

    async def __aenter__(self) -> Deployment:
        for role in self.roles:
            await role.start()
        await self.verifier.report_status()
        for role in self.drafters.values():
            await role.report_status()
        return self

    async def __aexit__(self, *exc: object) -> None:
        for role in reversed(self.roles):
            await role.close()


def generate(
    scorer: TargetScorer,
    drafter: Drafter | None,
    prompts: Sequence[Sequence[int]],
    max_new: int,
    *,
    m: int | None = 4,
    rule: int = 1,
    sampling: object = None,
    stop: Sequence[int] = (),
    seed: int = 0,
    backend: str = "auto",
    mlc: Store | None = None,
    on_round: Callable[[RoundInfo], None] | None = None,
    target_digest: bytes | None = None,
) -> list[SessionResult]:
    """Decode every prompt through the roles: ``drafter=None`` is target-only decoding (the
    verifier decodes each session itself, §6.5.2 self_decode). ``m`` fixes M (None: §6.2's
    choice from measured costs); ``sampling`` is the rule-2 :class:`~sdcp_fast.protocol.Sampling`;
    ``on_round`` sees each committed round (a bench marks its steady state by them).
    ``target_digest``: the scorer's weights digest where the caller has it (the catalog's),
    else it is computed here, a hash over every weight (a second of CPU for SmolLM2)."""
    import tempfile

    from sdcp_fast.store import embedded

    drafters = [] if drafter is None else [drafter]
    with tempfile.TemporaryDirectory(prefix="sdcp-generate-") as root:
        own = None
        if mlc is None:
            # Its logs go with the folder when this call returns: an fsync per round would make
            # nothing durable, and costs a round a disk flush and a thread hop's wait.
            own = mlc = embedded(root, sync_logs=False)
        try:
            engine = Engine(scorer, drafters, mlc, target_digest=target_digest or scorer_digest(scorer),
                            tokenizer_digest=model_digest("tokenizer"), backend=backend, seed=seed,
                            fixed_m=m, adaptive_m=m is None, on_round=on_round)
            specs = [spec_for(p, max_new=max_new, rule=rule, sampling=sampling, stop=stop, m=m) for p in prompts]
            return engine.run(specs)
        finally:
            if own is not None:
                own.close()


def spec_for(prompt: Sequence[int], *, max_new: int, rule: int = 1, sampling: object = None,
             stop: Sequence[int] = (), m: int | None = None) -> SessionSpec:
    """The session the command-line tools ask for: the front end's contract
    (:func:`~sdcp_fast.roles.router.serving_spec`); target-only sessions are self-decoded from
    the start (the verifier's ``self_decode_idle``)."""
    m_max = max(8, m or 0)
    return serving_spec(prompt, max_new=max_new, rule=rule, sampling=sampling, stop=tuple(stop),
                        m_max=m_max, m_init=min(m_max, m or 4))
