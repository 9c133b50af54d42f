"""roles/verifier_batch.py through the verifier's handler: when a batch closes (every session
that owes a proposal has sent it, ``max_batch`` rounds, or ``batch_wait`` seconds), one
scoring pass per batch, and a failed pass drops only its rounds (docs/interpretations.md,
"Verifier batching")."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Any

import pytest
import torch

from sdcp_fast.deploy.local import Engine, model_digest, spec_for
from sdcp_fast.model.drafters import NgramDrafter
from sdcp_fast.model.interfaces import ScoreRequest
from sdcp_fast.model.target_scorer import ModelRunner
from sdcp_fast.protocol import Sampling, SdcpProblem
from sdcp_fast.protocol.registry import SessionRegistry
from sdcp_fast.roles import verifier_batch
from sdcp_fast.roles.load import VerifierLoad
from sdcp_fast.roles.verifier_config import VerifierContext
from sdcp_fast.store import embedded
from tests.model.conftest import random_model

from .rolekit import PROMPT, VERIFIER, Rig, contract, proposal, run, sid, verifier_config

SESSIONS = [sid(40 + i) for i in range(5)]


async def _open_all(rig: Rig, n: int) -> list:
    states = []
    for session in SESSIONS[:n]:
        _, state = await rig.open(session, contract(max_new=32), m_init=2)
        states.append(state)
    return states


async def _propose_all(rig: Rig, states: list) -> list:
    return await asyncio.gather(*(rig.drafter.propose(VERIFIER, proposal(s, rig.greedy_after(s, 2))) for s in states))


def test_a_batch_closes_when_every_session_owing_a_proposal_has_sent_it(tmp_path):
    """Three sessions, a long batch_wait: the third proposal closes the batch at once, and the
    three rounds are scored in one pass."""

    async def scenario():
        async with Rig(str(tmp_path), batch_wait=30.0) as rig:
            states = await _open_all(rig, 3)
            t0 = time.monotonic()
            verdicts = await _propose_all(rig, states)
            return verdicts, time.monotonic() - t0, rig.verifier.target_passes, [r.batch for r in rig.rounds]

    verdicts, seconds, passes, batches = run(scenario())
    assert [v.round for v in verdicts] == [1, 1, 1] and all(v.accepted == 2 for v in verdicts)
    assert passes == 1 and batches == [3, 3, 3] and seconds < 15.0


@pytest.mark.parametrize(("sessions", "max_batch", "sizes"), [(5, 2, [2, 2, 1]), (3, 1, [1, 1, 1]), (5, 64, [5])])
def test_max_batch_bounds_each_pass(tmp_path, sessions, max_batch, sizes):
    async def scenario():
        # Sessions whose round was committed owe the next proposal: batch_wait closes the last batch.
        async with Rig(str(tmp_path), batch_wait=0.2, max_batch=max_batch) as rig:
            states = await _open_all(rig, sessions)
            verdicts = await _propose_all(rig, states)
            return verdicts, rig.verifier.target_passes, [r.batch for r in rig.rounds]

    verdicts, passes, batches = run(scenario())
    assert len(verdicts) == sessions and passes == len(sizes)
    assert sorted(batches, reverse=True) == sorted((n for n in sizes for _ in range(n)), reverse=True)


def test_batch_wait_closes_a_batch_a_session_owes_a_proposal_to(tmp_path):
    """Two sessions owe proposals, one sends: its round waits batch_wait, then goes alone."""

    async def scenario():
        async with Rig(str(tmp_path), batch_wait=0.3) as rig:
            states = await _open_all(rig, 2)
            t0 = time.monotonic()
            verdict = await rig.drafter.propose(VERIFIER, proposal(states[0], rig.greedy_after(states[0], 2)))
            return verdict, time.monotonic() - t0, [r.batch for r in rig.rounds]

    verdict, seconds, batches = run(scenario())
    assert verdict.round == 1 and batches == [1] and seconds >= 0.25


def test_a_failed_pass_drops_its_rounds_and_the_next_pass_serves_them(tmp_path):
    """A scorer failure answers each round of the pass 500 sdcp-internal-error, commits
    nothing, and the drafters' retries are scored by the next pass."""

    async def scenario():
        async with Rig(str(tmp_path), batch_wait=30.0) as rig:
            states = await _open_all(rig, 3)

            def fail_once(batch):
                rig.scorer.on_score = None
                raise RuntimeError("device lost")

            rig.scorer.on_score = fail_once
            failed = await asyncio.gather(*(rig.drafter.propose(VERIFIER, proposal(s, rig.greedy_after(s, 2)))
                                            for s in states), return_exceptions=True)
            committed = [rig.verifier.sessions.get(s.session).committed for s in states]
            verdicts = await _propose_all(rig, states)
            return failed, committed, verdicts, rig.rounds

    failed, committed, verdicts, rounds = run(scenario())
    assert all(isinstance(f, SdcpProblem) and f.status == 500 for f in failed), failed
    assert all(f.received_type.endswith("sdcp-internal-error") for f in failed)  # not a type the draft lists
    assert committed == [0, 0, 0]
    assert [v.round for v in verdicts] == [1, 1, 1] and [r.batch for r in rounds] == [3, 3, 3]


class FedRunner(ModelRunner):
    """Records, per pass, the positions each request made the model compute."""

    def __init__(self, *a, **kw) -> None:
        super().__init__(*a, **kw)
        self.fed: list[list[int]] = []

    def score(self, batch: Sequence[ScoreRequest]) -> list[torch.Tensor]:
        self.fed.append([len(r.committed) - self.cache.reconcile(r.session, r.committed, keep_last=1) + len(r.proposal)
                         for r in batch])
        return super().score(batch)


def _prompt(n: int, seed: int) -> list[int]:
    return torch.randint(1, 97, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


PROMPTS = [_prompt(45, 1), _prompt(29, 2), [7], _prompt(6, 3)]


def _decode(tmp_path, chunk: int, ngram: bool, rule: int = 1, *, solo: int | None = None,
            prompts: Sequence[Sequence[int]] = PROMPTS, max_new: Sequence[int] = ()) -> tuple[list[list[int]], FedRunner]:
    runner = FedRunner(random_model(), block_size=4)
    mlc = embedded(str(tmp_path / f"mlc-{chunk}-{solo}-{ngram}-{rule}-{len(prompts)}"))
    sampling = Sampling(temperature_milli=900, seed=11) if rule == 2 else None
    try:
        engine = Engine(runner, [NgramDrafter(97)] if ngram else [], mlc, target_digest=model_digest("small"),
                        tokenizer_digest=model_digest("tokenizer"), fixed_m=3, adaptive_m=False, prefill_chunk=chunk,
                        prefill_solo=chunk if solo is None else solo)
        results = engine.run([spec_for(p, max_new=n, m=3, rule=rule, sampling=sampling)
                              for p, n in zip(prompts, [*max_new, *[10] * len(prompts)], strict=False)])
    finally:
        mlc.close()
    assert all(r.chain_ok and not r.problems for r in results)
    return [r.tokens for r in results], runner


@pytest.mark.parametrize("ngram", [False, True], ids=["self-decoding", "drafter"])
def test_chunked_prefill_decodes_what_one_pass_does(tmp_path, ngram):
    """Rule 1 with prompts fed in chunks of 7 or 13 tokens (45 and 29 tokens: not multiples)
    equals the prompts fed in one pass, target-only and with a drafter, whose first round waits
    for its session's prefill; no pass feeds more than one chunk of prompt tokens besides one
    token per round."""
    whole, one = _decode(tmp_path, 0, ngram)
    assert max(sum(f) - len(f) for f in one.fed) >= 44  # the 45-token prompt in one pass
    for chunk in (7, 13):
        tokens, runner = _decode(tmp_path, chunk, ngram)
        assert tokens == whole, chunk
        assert max(sum(f) - len(f) for f in runner.fed) <= chunk + 3 * len(PROMPTS)  # + M per round
        assert len(runner.fed) > len(one.fed)
    assert _decode(tmp_path, 7, ngram, solo=20)[0] == whole  # bigger passes where no round shares them


def test_the_check_before_an_idle_wait_answers_as_the_plans_survey(tmp_path, monkeypatch):
    """``Batcher._pending`` walks the sessions without building their needs: over chunked
    prefill, self-decoded and drafted sessions it answers what ``pending`` over ``_survey``
    does, asked right after it."""
    answers: list[tuple[bool, bool]] = []
    walk = verifier_batch.Batcher._pending

    def both(self: verifier_batch.Batcher) -> bool:
        found = walk(self)
        answers.append((found, verifier_batch.pending(self._survey()[1], self.prefill_chunk)))
        return found

    monkeypatch.setattr(verifier_batch.Batcher, "_pending", both)
    for ngram in (False, True):
        _decode(tmp_path, 7, ngram)
    assert all(fast == surveyed for fast, surveyed in answers)
    assert {fast for fast, _ in answers} == {True, False}


def test_a_pass_no_decoding_round_shares_feeds_the_solo_budget(tmp_path, monkeypatch):
    """Alone, the 45-token prompt goes in passes of up to 16 tokens (``prefill_solo``); beside a
    decoding session, in chunks of 4 (``prefill_chunk``, not grown here); the output is one
    pass's either way."""
    monkeypatch.setattr(verifier_batch, "GROW_BELOW", 0.0)
    # The decoding session opens first: opened second, it could still be opening while the
    # long prompt's first solo passes ran (their number followed the machine's load).
    alone, shared = [PROMPTS[0]], [[7], PROMPTS[0]]
    whole_alone, _ = _decode(tmp_path, 0, False, prompts=alone)
    tokens, runner = _decode(tmp_path, 4, False, solo=16, prompts=alone)
    assert tokens == whole_alone
    assert runner.fed[:3] == [[16], [16], [13]]  # two solo chunks, then the first round takes the rest

    whole_shared, _ = _decode(tmp_path, 0, False, prompts=shared, max_new=[30, 10])
    tokens, runner = _decode(tmp_path, 4, False, solo=16, prompts=shared, max_new=[30, 10])
    assert tokens == whole_shared
    both = [f for f in runner.fed if len(f) == 2]
    assert len(both) >= 10 and max(max(f) for f in both) <= 4  # the short session decodes in each of them


def budget_batcher() -> verifier_batch.Batcher:
    """A batcher that only learns pass times: 4 rounds a pass, chunks of 32 to 128 tokens."""
    config = verifier_config(max_batch=4, prefill_chunk=32, prefill_solo=128)
    stub: Any = None
    context = VerifierContext(store=stub, objects=stub, load=VerifierLoad(4), metrics=stub, background=stub,
                              clock=time.monotonic)
    return verifier_batch.Batcher(FedRunner(random_model(), block_size=4), SessionRegistry(), config, context,
                                  committer=stub)


def test_the_shared_budget_follows_pass_times():
    """Beside decoding rounds, the budget doubles after a pass that fed all of it in little more
    than the median pass of decoding rounds alone (up to ``prefill_solo``) and halves after a slow one
    (down to ``prefill_chunk``); nothing changes before such a pass was timed."""
    b = budget_batcher()
    b._adapt(0.5, 32)
    assert b.shared_budget == 32  # no pass of decoding rounds alone timed yet
    for took in (1.0, 9.0, 1.0):  # decoding rounds alone: 1 s, and a spike the median ignores
        b._adapt(took, 0)
    steps = [(1.1, 32, 64), (1.2, 64, 128), (1.0, 128, 128), (1.5, 128, 128), (1.2, 10, 128), (2.0, 128, 64),
             (3.0, 64, 32), (3.0, 32, 32), (1.2, 16, 32)]
    for took, prefill, budget in steps:
        b._adapt(took, prefill)
        assert b.shared_budget == budget, (took, prefill)


def test_a_pass_that_held_a_round_back_for_lack_of_budget_lets_it_grow():
    """First rounds of short prompts (a few context tokens each) seldom add up to exactly the
    shared budget: a pass that left one queued for lack of it counts as a full one (it grows when
    the pass cost little more, and a slow pass still halves it)."""
    b = budget_batcher()
    for took in (1.0, 1.0):
        b._adapt(took, 0)
    steps = [(1.1, 30, False, 32), (1.1, 30, True, 64), (1.2, 62, True, 128), (1.0, 3, True, 128),
             (2.0, 30, True, 64)]
    for took, prefill, held_back, budget in steps:
        b._adapt(took, prefill, held_back=held_back)
        assert b.shared_budget == budget, (took, prefill, held_back)


@pytest.mark.parametrize(("sessions", "prompt", "batch_wait", "sizes"), [
    (24, PROMPT, 5.0, [24]),  # 3 context tokens each: within a round's own M + 1 = 3 positions
    (4, (1, 4, 7, 1), 0.5, [2, 2])])  # 4: charged in full, two such first rounds to an 8-token budget
def test_a_first_round_over_a_short_context_is_not_charged_to_the_prefill_budget(tmp_path, sessions, prompt,
                                                                                batch_wait, sizes):
    """A first round whose context is no longer than the M + 1 positions a decoding round
    carries does not count against a pass's prefill budget: many new sessions with short
    prompts all go in one pass (charged, an 8-token budget took two 3-token ones a pass),
    while a longer context still counts in full."""

    async def scenario():
        async with Rig(str(tmp_path), batch_wait=batch_wait, max_batch=64, prefill_chunk=8, prefill_solo=8) as rig:
            states = [(await rig.open(sid(100 + i), contract(max_new=32), m_init=2, prompt=prompt))[1]
                      for i in range(sessions)]
            verdicts = await asyncio.gather(*(rig.drafter.propose(VERIFIER, proposal(s, rig.greedy_after(s, 2, prompt)))
                                              for s in states))
            return verdicts, rig.verifier.target_passes, [r.batch for r in rig.rounds]

    verdicts, passes, batches = run(scenario())
    assert [v.round for v in verdicts] == [1] * sessions and all(v.accepted == 2 for v in verdicts)
    assert passes == len(sizes) and batches == [n for n in sizes for _ in range(n)]


def test_seeded_rule2_output_is_the_same_chunked_or_not(tmp_path):
    """Chunks change where the prompt's KV is computed, never a round's randoms (§6.4: the
    session, the round and the position): a seeded rule-2 run repeats chunked or not."""
    whole, _ = _decode(tmp_path, 0, False, rule=2)
    assert _decode(tmp_path, 7, False, rule=2)[0] == whole


@pytest.mark.parametrize(("chunk", "solo", "n", "how", "passes"), [
    (16, 16, 2, "in chunks of at most 16", "3 passes"),
    # Alone (no other prompt whose opening may or may not share the first pass): 32 + 13 tokens.
    (16, 32, 1, "in chunks of at most 16, 32 when no round shares the pass", "2 passes"),
    (16, 0, 1, "in chunks of at most 16, the rest when no round shares the pass", "1 pass"),
    (0, None, 2, "in one pass", "1 pass")])
def test_a_long_prefill_is_logged_at_its_start_and_end(tmp_path, monkeypatch, caplog, chunk, solo, n, how, passes):
    monkeypatch.setattr(verifier_batch, "LONG_PREFILL", 40)
    runner = FedRunner(random_model(), block_size=4)
    mlc = embedded(str(tmp_path / "mlc"))
    try:
        engine = Engine(runner, [], mlc, target_digest=model_digest("small"),
                        tokenizer_digest=model_digest("tokenizer"), prefill_chunk=chunk, prefill_solo=solo)
        with caplog.at_level(logging.INFO, logger="sdcp_fast.verifier"):
            results = engine.run([spec_for(p, max_new=2) for p in PROMPTS[:n]])
    finally:
        mlc.close()
    long = results[0].session.hex()
    lines = [r.getMessage() for r in caplog.records if "prefill" in r.getMessage()]
    assert lines[0] == f"session {long}: prefill of 45 tokens starts ({how})"
    assert lines[1].startswith(f"session {long}: prefill of 45 tokens done in ") and lines[1].endswith(f" ({passes})")
    assert len(lines) == 2  # the 29-token prompt is below the line


def test_a_failed_prefill_chunk_leaves_the_rest_to_one_pass(tmp_path):
    """A pass holding a prefill chunk fails: the session is not chunked again (no pass loop on
    a chunk that cannot be scored), its first round feeds the rest, and the output is the same."""
    whole, _ = _decode(tmp_path, 0, False)

    class FailingOnce(FedRunner):
        failed = False

        def score(self, batch):
            if not self.failed and any(not r.proposal and len(r.committed) < 45
                                       and list(r.committed) == PROMPTS[0][: len(r.committed)] for r in batch):
                self.failed = True
                raise RuntimeError("device lost")
            return super().score(batch)

    runner = FailingOnce(random_model(), block_size=4)
    mlc = embedded(str(tmp_path / "mlc-failing"))
    try:
        engine = Engine(runner, [], mlc, target_digest=model_digest("small"),
                        tokenizer_digest=model_digest("tokenizer"), prefill_chunk=13, prefill_solo=13)
        results = engine.run([spec_for(p, max_new=10, m=3) for p in PROMPTS])
    finally:
        mlc.close()
    assert runner.failed and [r.tokens for r in results] == whole
    assert max(runner.fed[0]) == 45  # after the failure, the 45-token prompt went in one pass


def test_a_retry_after_the_first_request_was_cancelled_gets_the_rounds_verdict(tmp_path):
    """A drafter whose request was cancelled while its round waited for a batch (its client
    gave up) sends it again: the retry waits for that round's one scoring and gets its verdict."""

    async def scenario():
        async with Rig(str(tmp_path), batch_wait=0.3) as rig:
            states = await _open_all(rig, 2)  # the other session owes a proposal: the batch waits
            p = proposal(states[0], rig.greedy_after(states[0], 2))
            first = asyncio.create_task(rig.drafter.propose(VERIFIER, p))
            await asyncio.sleep(0.05)
            first.cancel()
            await asyncio.gather(first, return_exceptions=True)
            retried = await rig.drafter.propose(VERIFIER, p)
            return first.cancelled(), retried, rig.scorer.scored, [r.round for r in rig.rounds]

    cancelled, retried, scored, rounds = run(scenario())
    assert cancelled and retried.round == 1 and rounds == [1]
    assert len(scored) == 1  # scored once
