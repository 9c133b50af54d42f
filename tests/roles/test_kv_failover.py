"""Fail-over from published target KV pages (§6.3 "MAY publish the target KV cache", §6.9
``resume.target_kv``; docs/reliability.md, scenario 2): verifier A publishes the pages of its
committed prefix, the router names them in the resume, verifier B imports them and computes
only the positions after them; the committed output equals target-only greedy decoding. Both
verifiers run a real paged runner over a small random Llama."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Sequence
from typing import Any

import pytest
import torch

from sdcp_fast.cache import object_uri
from sdcp_fast.cache.uri import writer_tag
from sdcp_fast.model.drafters import ModelDrafter
from sdcp_fast.model.interfaces import ScoreRequest
from sdcp_fast.model.kv_transfer import Layout, PagedTargetKV, decode
from sdcp_fast.model.llama import Transformer
from sdcp_fast.model.target_scorer import ModelRunner, greedy_token
from sdcp_fast.protocol.peer import Peer, PeerRole
from sdcp_fast.roles.drafter import DrafterRole
from sdcp_fast.roles.router import RouterRole, SessionSpec
from sdcp_fast.roles.verifier import VerifierConfig, VerifierRole
from sdcp_fast.store import embedded
from sdcp_fast.transport.inprocess import InProcessNetwork
from tests.model.conftest import random_model

from .rolekit import DRAFTER, ROUTER, ROUTER_PEER, SCOPE, TOKENIZER, Clock, run, sid, until

S = sid(61)
ACTIVE = "inproc://verifier-a/"
STANDBY = "inproc://verifier-b/"
TARGET = hashlib.sha256(b"tests/roles/kv-failover target").digest()
PROMPT = tuple(torch.randint(1, 97, (40,), generator=torch.Generator().manual_seed(3)).tolist())
M = 3


class CountingRunner(ModelRunner):
    """Records, per scored request, (session, committed length, positions the pass computed):
    its reconcile, asked first, answers what the pass itself keeps."""

    def __init__(self, model: Transformer, **kw: Any) -> None:
        super().__init__(model, **kw)
        self.computed: list[tuple[bytes, int, int]] = []

    def score(self, batch: Sequence[ScoreRequest]) -> list[torch.Tensor]:
        for r in batch:
            kept = self.cache.reconcile(r.session, r.committed, keep_last=1)
            self.computed.append((r.session, len(r.committed), len(r.committed) - kept + len(r.proposal)))
        return super().score(batch)


def greedy(model: Transformer, prompt: Sequence[int], n: int) -> list[int]:
    runner = ModelRunner(model, block_size=4)
    out = [greedy_token(runner.prefill(b"g" * 16, prompt))]
    while len(out) < n:
        out.append(greedy_token(runner.decode_one([(b"g" * 16, [*prompt, *out])])[0]))
    return out


def counter(role: VerifierRole, name: str, **labels: str) -> float:
    value = role.metrics.registry.get_sample_value(name, labels or None)
    return 0.0 if value is None else value


class NoPages:
    """The store as verifier A sees it when every write of target KV pages fails."""

    def __init__(self, store: Any) -> None:
        self.store = store

    async def put(self, uri: str, data: Any, lease_ttl: float | None = None) -> Any:
        if "/target_kv/" in uri:
            raise ConnectionError("the MLC refused the pages")
        return await self.store.put(uri, data, lease_ttl)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


def failover(tmp_path: Any, mode: str) -> dict[str, Any]:
    """``mode``: ``pages`` (B imports A's pages), ``cold`` (B's scorer offers no pages),
    ``foreign`` (B's pages adapter is another model's: A's pages are refused), ``unpublished``
    (A's publishes all fail: the router names none), ``offload`` (as ``pages``, both verifiers
    scoring on a thread of their own, as the services do)."""
    model = random_model()
    clock = Clock()
    network = InProcessNetwork()
    mlc = embedded(str(tmp_path))
    killed: list[int] = []

    def kill_after_round_3(info: Any) -> None:
        if info.round == 3 and not killed:
            killed.append(info.round)
            network.unregister(ACTIVE)  # partitioned: it answers nobody from now on

    def verifier(uri: str, runner: ModelRunner, on_round: Any = None, store: Any = mlc,
                 target_kv: Any = "auto", **kw: Any) -> VerifierRole:
        config = VerifierConfig(uri=uri, target_digest=TARGET, router=ROUTER, backend="reference", batch_wait=0.0,
                                output_wait=0.1, offload=mode == "offload", **kw)
        role = VerifierRole(runner, config, mlc=store, transport=network.transport(Peer(uri, PeerRole.VERIFIER)),
                            on_round=on_round, target_kv=target_kv)
        network.register(uri, role.handler)
        return role

    async def scenario() -> dict[str, Any]:
        router = RouterRole(uri=ROUTER, mlc=mlc, transport=network.transport(ROUTER_PEER), target_digest=TARGET,
                            tokenizer_digest=TOKENIZER, scope=SCOPE, clock=clock,
                            drafter_models={DRAFTER: b"a" * 32}, sweep_interval=0.01)
        network.register(ROUTER, router.handler)
        runner_a, runner_b = CountingRunner(model, block_size=4), CountingRunner(model, block_size=4)
        # A publishes after every commit (the test needs its newest prefix in the MLC).
        active = verifier(ACTIVE, runner_a, kill_after_round_3, kv_publish_tokens=1, kv_publish_growth=0.0,
                          store=NoPages(mlc) if mode == "unpublished" else mlc)
        b_kv: Any = {"pages": "auto", "offload": "auto", "unpublished": "auto", "cold": None,
                     "foreign": PagedTargetKV(runner_b.cache, hashlib.sha256(b"another model").digest())}[mode]
        standby = verifier(STANDBY, runner_b, target_kv=b_kv)
        # The target's own layers as the drafter: every proposal is accepted (rule 1), so rounds are M + 1 tokens.
        drafter = DrafterRole(ModelDrafter(model), uri=DRAFTER, mlc=mlc, router=ROUTER, fixed_m=M,
                              transport=network.transport(Peer(DRAFTER, PeerRole.DRAFTER)))
        network.register(DRAFTER, drafter.handler)
        roles = [active, drafter, standby]
        for role in roles[:2]:
            await role.start()
        try:
            await until(lambda: router.table.status(DRAFTER, clock()) is not None)
            routed = await router.open(SessionSpec(PROMPT, max_new=24, session=S, m_init=M, m_max=M))
            await standby.start()
            stream = asyncio.create_task(router.text(S))
            await until(lambda: killed)
            live = active.live(S)
            committed_at_a = len(PROMPT) + live.session.committed
            # A's last publish (of round 3's prefix) completes; the partition does not stop it.
            if mode == "unpublished":
                await until(lambda: not live.kv.busy and active.metrics.kv_failures._value.get() >= 1)
            else:
                await until(lambda: not live.kv.busy and live.kv.published >= committed_at_a)
            clock.advance(11.0)
            await standby.report_status()
            await drafter.report_status()
            await router.sweep()
            tokens, _ = await asyncio.wait_for(stream, 15.0)
            # B published its own epoch's pages on the way, and deleted them once the session ended.
            ended = object_uri(SCOPE, S, "target_kv", 2, tag=writer_tag(STANDBY))
            await until(lambda: not standby.live(S).kv.busy and not mlc.mlc.contains(ended))
            ref = object_uri(SCOPE, S, "target_kv", 1, tag=writer_tag(ACTIVE))
            published = 0 if mode == "unpublished" else len(decode(mlc.mlc.get(ref), Layout.of(runner_a.cache, TARGET)))
            return dict(routed=routed, tokens=tokens, committed_at_a=committed_at_a, published=published,
                        b=[c for c in runner_b.computed if c[0] == S], active=active, standby=standby)
        finally:
            for role in roles:
                await role.close()

    try:
        out = run(scenario(), timeout=60.0)
    finally:
        mlc.close()
    out["expected"] = greedy(model, PROMPT, 24)
    return out


@pytest.mark.parametrize("mode", ["pages", "offload", "cold", "foreign", "unpublished"])
def test_the_new_verifier_resumes_from_published_pages_and_computes_only_the_rest(tmp_path, mode):
    out = failover(tmp_path, mode)
    assert out["routed"].verifier == STANDBY and out["routed"].epoch == 2
    # The committed output is the uninterrupted run's (rule 1: the target's greedy decoding).
    assert out["tokens"] == out["expected"]
    committed, published = out["committed_at_a"], out["published"]
    # B's first round; a cold context longer than a prefill chunk was fed by chunks before it.
    first = next(i for i, (_, n, _) in enumerate(out["b"]) if n == committed)
    assert all(n < committed for _, n, _ in out["b"][:first])
    first_computed = sum(c for _, _, c in out["b"][: first + 1])
    standby, active = out["standby"], out["active"]
    if mode == "unpublished":
        # Failed publishes are counted and change nothing else; the router finds no pages to name.
        assert counter(active, "sdcp_target_kv_published_total") == 0
        assert counter(active, "sdcp_target_kv_publish_failures_total") >= 1
        assert counter(standby, "sdcp_resumes_total", kv="cold", reason="none") == 1
        assert first_computed == committed + M
        return
    # A published every committed position it had cached: all but the last round's extra token.
    assert published == committed - 1
    assert counter(active, "sdcp_target_kv_published_total") >= 1
    assert counter(active, "sdcp_target_kv_published_bytes_total") > 0
    assert counter(active, "sdcp_target_kv_publish_failures_total") == 0
    if mode != "cold":
        assert counter(standby, "sdcp_target_kv_published_total") >= 1
    if mode in ("pages", "offload"):
        # The last committed position is always computed (its logits are needed); nothing before it.
        assert first_computed == committed - min(published, committed - 1) + M == 1 + M
        assert counter(standby, "sdcp_resumes_total", kv="pages", reason="") == 1
        assert counter(standby, "sdcp_resumed_kv_positions_total") == published
    else:
        assert first_computed == committed + M  # a cold prefill of prompt and output
        reason = "unsupported" if mode == "cold" else "refused"
        assert counter(standby, "sdcp_resumes_total", kv="cold", reason=reason) == 1
        assert counter(standby, "sdcp_resumed_kv_positions_total") == 0
