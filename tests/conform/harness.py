"""The kit against our verifier role in process (no sockets, no processes), with the hook the
self-tests use to make that verifier wrong on purpose.

:func:`run_kit` builds a :class:`~sdcp_fast.roles.verifier.VerifierRole` on the toy target and
an embedded store, and runs :class:`~sdcp_fast.conform.kit.Conform` against it. ``wrap`` is the
fault-injection hook: a function ``wrap(handler) -> handler`` whose result answers every
request in the verifier's place (tests/conform/faults.py builds the wrong verifiers with it,
tests/conform/variants.py the faithful ones that choose differently where the draft is
silent). ``patches`` are ``(object, attribute, value)`` set for the run and put back after;
``scorer`` replaces the toy target. Session ids are drawn from a counter, so a run is the
same every time (the seeded rule-2 rounds included); the kit's oracle is the toy target.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any

from sdcp_fast.conform.adapters import MlcStore
from sdcp_fast.conform.client import Answer, Identities
from sdcp_fast.conform.kit import GROUPS, Conform
from sdcp_fast.conform.oracles import ScorerOracle
from sdcp_fast.conform.report import Report
from sdcp_fast.deploy.local import model_digest
from sdcp_fast.model.toy import ToyTarget
from sdcp_fast.protocol.peer import Peer, PeerRole
from sdcp_fast.roles.verifier import VerifierConfig, VerifierRole
from sdcp_fast.store import embedded
from sdcp_fast.transport.base import Request, Response
from sdcp_fast.transport.inprocess import InProcessNetwork

Handler = Callable[[Request], Awaitable[Response]]
TARGET = model_digest("toy-target")
VERIFIER = "https://127.0.0.1:8501/"
IDS = Identities(router=Peer("https://127.0.0.1:8500/", PeerRole.ROUTER),
                 drafter=Peer("https://127.0.0.1:8511/", PeerRole.DRAFTER))


@contextlib.contextmanager
def patched(patches: Sequence[tuple[Any, str, Any]]) -> Iterator[None]:
    saved = [(obj, name, getattr(obj, name)) for obj, name, _ in patches]
    try:
        for obj, name, value in patches:
            setattr(obj, name, value)
        yield
    finally:
        for obj, name, value in reversed(saved):
            setattr(obj, name, value)


def run_kit(root: str, *, wrap: Callable[[Handler], Handler] | None = None,
            patches: Sequence[tuple[Any, str, Any]] = (), groups: tuple[str, ...] = GROUPS,
            store: bool = True, scorer: Any = None, kit_kw: dict[str, Any] | None = None) -> Report:
    async def scenario() -> Report:
        mlc = embedded(root)
        config = VerifierConfig(uri=VERIFIER, target_digest=TARGET, backend="reference", batch_wait=0.0, output_wait=0.05)
        role = VerifierRole(scorer or ToyTarget(), config, mlc=mlc, transport=InProcessNetwork().transport(None))
        await role.start()
        handler: Handler = role.handler if wrap is None else wrap(role.handler)

        def sender(peer: Peer) -> Any:
            async def send(method: str, path: str, body: bytes = b"", query: Any = None) -> Answer:
                headers = {"content-type": "application/sdcp+cbor"} if body else {}
                response = await handler(Request(method, path, query=query or {}, body=body, headers=headers,
                                                 peer=peer))
                return Answer(response.status, response.body, response.content_type)
            return send

        try:
            counter = iter(range(1 << 30))
            kit = Conform(VERIFIER, as_router=sender(IDS.router), as_drafter=sender(IDS.drafter), ids=IDS,
                          target_digest=TARGET, vocab=ToyTarget().vocab_size,
                          store=MlcStore(mlc) if store else None, oracle=ScorerOracle(ToyTarget()),
                          session_ids=lambda: hashlib.sha256(b"conform-%d" % next(counter)).digest()[:16],
                          **(kit_kw or {}))
            return await kit.run(groups)
        finally:
            await role.close()
            mlc.close()

    with patched(patches):
        return asyncio.run(asyncio.wait_for(scenario(), 120))
