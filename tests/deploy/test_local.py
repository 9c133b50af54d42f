"""The in-process deployment (``deploy.local``): the three roles on the in-process transport drive
sessions through the core, the store and the kernels."""

from __future__ import annotations

import asyncio

import pytest
import torch

from sdcp_fast.cache import object_uri
from sdcp_fast.deploy.local import Engine, SessionSpec, model_digest, session_id_for
from sdcp_fast.model.interfaces import ScoreRequest
from sdcp_fast.model.toy import ToyDrafter, ToyTarget, encode
from sdcp_fast.protocol import Action, Sampling
from sdcp_fast.protocol.commitlog import CommitRecord, FenceRecord
from sdcp_fast.roles.objects import unpack_tokens
from sdcp_fast.store import embedded

SCOPE = __import__("hashlib").sha256(b"sdcp-fast-inprocess").digest()[:16]


def make_engine(tmp_path, *, noise=(0.8, 6.0), records=None, adaptive_m=False):
    target = ToyTarget()
    drafters = [ToyDrafter("good", target, noise[0]), ToyDrafter("weak", target, noise[1], seed=3)]
    mlc = embedded(str(tmp_path))
    engine = Engine(target, drafters, mlc, target_digest=model_digest("t"), tokenizer_digest=model_digest("w"),
                    adaptive_m=adaptive_m, on_round=None if records is None else records.append)
    return engine, target, mlc


def greedy(target: ToyTarget, prompt: list[int], n: int) -> list[int]:
    out: list[int] = []
    for _ in range(n):
        row = target.score([ScoreRequest(b"g" * 16, [*prompt, *out], [])])[0][0]
        out.append(int(torch.argmax(row)))
    return out


@pytest.mark.parametrize("drafters", [("good",), ("weak",), None])
def test_rule1_output_is_greedy_decoding_of_the_target(tmp_path, drafters):
    """§6.4 rule 1: the output is greedy decoding of the target, whatever the drafter."""
    engine, target, _ = make_engine(tmp_path)
    prompt = encode("the verifier commits")
    [result] = engine.run([SessionSpec(prompt, max_new=24, drafters=drafters, fallback=(Action.REDUCE,) * 3
                                       + (Action.SELF_DECODE, Action.REDUCE))])
    assert result.tokens == greedy(target, prompt, len(result.tokens))
    assert result.chain_ok


def test_weak_drafter_walks_the_ladder_and_the_log_holds_every_round(tmp_path):
    records = []
    engine, _, mlc = make_engine(tmp_path, records=records)
    [result] = engine.run([SessionSpec(encode("every session is"), max_new=40, drafters=("weak",))])
    actions = {r.action for r in records}
    assert {Action.REDUCE, Action.SWITCH, Action.SELF_DECODE} <= actions
    assert result.finish in (Action.FAIL, Action.FINISH) and result.chain_ok
    log = mlc.logs.log(object_uri(SCOPE, result.session, "commit_log"))
    commits = [r for r in log.read().records if isinstance(r, CommitRecord)]
    assert [c.round for c in commits] == list(range(1, result.rounds + 1))
    assert [t for c in commits for t in c.emitted] == result.tokens
    assert commits[-1].digest == result.digest


def test_rule2_seeded_runs_are_bit_identical_and_use_the_mlc(tmp_path):
    spec = SessionSpec(encode("a drafter proposes tokens"), max_new=30, rule=2,
                       sampling=Sampling(temperature_milli=700, top_k=20, seed=9), drafters=("good",))
    runs = []
    for k in range(2):
        engine, _, mlc = make_engine(tmp_path / str(k))
        runs.append(engine.run([spec])[0])
        assert mlc.mlc.stats()  # q rows went through the cache
    assert runs[0].tokens == runs[1].tokens and runs[0].digest == runs[1].digest
    assert runs[0].proposed > 0 and runs[0].chain_ok


def test_batch_of_mixed_rules_finishes_every_session(tmp_path):
    engine, _, _ = make_engine(tmp_path)
    specs = [SessionSpec(encode("the router"), max_new=16, rule=1 + i % 2,
                         sampling=Sampling(seed=i) if i % 2 else None) for i in range(5)]
    results = engine.run(specs)
    assert all(r.chain_ok and r.finish is not None for r in results)
    assert engine.target_passes < sum(len(r.tokens) for r in results)


def test_fenced_log_stops_the_session_without_releasing_the_round(tmp_path):
    """§6.3/§6.8: after a fence with a newer epoch the verifier commits and releases nothing more."""
    engine, _, mlc = make_engine(tmp_path)
    spec = engine._spec(SessionSpec(encode("the router"), max_new=30, drafters=("good",)), 0)
    committed = []

    async def scenario():
        async with engine.deployment(committed.append) as d:
            routed = await d.router.open(spec)
            while not committed:
                await asyncio.sleep(0.001)
            # A fail-over elsewhere fences this verifier's epoch.
            mlc.logs.log(routed.commit_log).append(FenceRecord(epoch=2), None)
            session = d.verifier.sessions.get(routed.session)
            for _ in range(2000):
                if session.closed:
                    break
                await asyncio.sleep(0.001)
            return routed, session

    routed, session = asyncio.run(scenario())
    assert session.closed and session.committed == sum(len(r.emitted) for r in committed)
    records = [r for r in mlc.logs.log(routed.commit_log).read().records if isinstance(r, CommitRecord)]
    assert [r.round for r in records] == [r.round for r in committed]
    # What drafters and a new verifier learn, the object's prefix as long as the last record says,
    # is exactly what was committed before the fence.
    committed_tokens = [t for r in records for t in r.emitted]
    released = unpack_tokens(mlc.mlc.get(routed.committed_tokens))
    assert list(released[: records[-1].committed]) == committed_tokens


def test_q_rows_lost_from_the_cache_answer_q_unavailable_and_commit_nothing(tmp_path):
    """§6.3: rows that cannot be obtained reject the round with sdcp-q-unavailable."""
    engine, target, mlc = make_engine(tmp_path)
    real_get = mlc.get
    lost = []

    async def lose_q_rows_once(uri):
        if "/q_rows/" in uri and not lost:
            from sdcp_fast.cache import ObjectUnavailable

            lost.append(uri)
            raise ObjectUnavailable(uri)
        return await real_get(uri)

    mlc.get = lose_q_rows_once
    spec = SessionSpec(encode("the router"), max_new=8, rule=2, sampling=Sampling(seed=1), drafters=("good",))
    [result] = engine.run([spec])
    assert lost and result.problems == ["sdcp-q-unavailable"]
    assert result.chain_ok and len(result.tokens) == 8  # the drafter proposed again and the rounds commit
    records = mlc.logs.log(object_uri(SCOPE, result.session, "commit_log")).read().records
    assert [r.round for r in records] == list(range(1, result.rounds + 1))  # nothing for the lost round


def test_session_ids_come_from_the_seed_in_process(tmp_path):
    engine, _, _ = make_engine(tmp_path)
    [result] = engine.run([SessionSpec(encode("the router"), max_new=4)])
    assert result.session == session_id_for(0, 0)


def test_target_only_decoding_goes_through_the_verifier(tmp_path):
    """No drafter: the verifier decodes the session itself, one round per token (§6.5.2)."""
    target = ToyTarget()
    mlc = embedded(str(tmp_path))
    engine = Engine(target, [], mlc, target_digest=model_digest("t"), tokenizer_digest=model_digest("w"))
    prompt = encode("the verifier commits")
    [result] = engine.run([SessionSpec(prompt, max_new=12, self_load=100, self_max=None)])
    assert result.tokens == greedy(target, prompt, 12) and result.chain_ok
    assert result.self_decoded == 12 and result.rounds == 12 and result.proposed == 0


def test_adaptive_choice_of_m_follows_measured_costs(tmp_path):
    engine, _, _ = make_engine(tmp_path, adaptive_m=True)
    [result] = engine.run([SessionSpec(encode("the verifier commits"), max_new=20, drafters=("good",))])
    assert result.chain_ok and result.proposed > 0
