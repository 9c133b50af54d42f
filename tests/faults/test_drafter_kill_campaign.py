"""Drafter death at many points (§6.9, docs/reliability.md "Drafter death"), in process: a router,
a verifier and two drafters on one in-process network, and one of the drafters "killed" (it
answers nothing from then on and reports no status, as after ``kill -9``) when the session has
committed a seeded random number of tokens. Either drafter may be the one killed: the one
proposing, or one that was told to stop while the verifier decodes the session itself.

Both rules: rule 1 with drafters that propose well and with drafters whose every proposal is
rejected (the ladder goes on to switch and self_decode, so kills land in self-decoding too);
rule 2 with one drafted token per round (M = 1 is never cut by m_cap, so a new drafter's
rounds are the old one's and a seeded session repeats token for token). Every run must end
in ``finish`` with the uninterrupted run's text, and never go a few ttl_ms without output.
"""

from __future__ import annotations

import asyncio
import logging
import random
import tempfile
import time
from dataclasses import dataclass

import pytest

from sdcp_fast.model.interfaces import Draft
from sdcp_fast.model.toy import ToyDrafter, ToyTarget
from sdcp_fast.protocol import Action, Sampling
from sdcp_fast.protocol.messages import RULE_GREEDY, RULE_SPECULATIVE
from sdcp_fast.protocol.peer import Peer, PeerRole
from sdcp_fast.roles.drafter import DrafterRole
from sdcp_fast.roles.router import RouterRole, serving_spec
from sdcp_fast.roles.verifier import VerifierConfig, VerifierRole
from sdcp_fast.store import embedded
from sdcp_fast.transport.inprocess import InProcessNetwork
from tests.roles.rolekit import PROMPT, ROUTER, SCOPE, TARGET, TOKENIZER, VERIFIER, sid

TTL_MS = 250
MAX_NEW = 48
SILENCE = 8 * TTL_MS / 1000  # no output for this long is a stall: the watchdog acts after 3 ttl_ms
DRAFTERS = ("inproc://drafter/a/", "inproc://drafter/b/")
KILLS = 8  # kill points per configuration
PASS_SECONDS = 0.02  # each scoring pass takes this long (off the event loop), so a session outlives a ttl_ms


class Slow:
    """The toy target, taking ``PASS_SECONDS`` per scoring pass."""

    def __init__(self, target: ToyTarget) -> None:
        self.target, self.vocab_size = target, target.vocab_size

    def score(self, batch):
        time.sleep(PASS_SECONDS)
        return self.target.score(batch)

    def release(self, session: bytes) -> None:
        self.target.release(session)


class Rejected:
    """A drafter whose every proposal the target rejects: the ladder reduces, switches, then
    decodes the session at the verifier."""

    def __init__(self, inner: ToyDrafter, vocab: int) -> None:
        self.inner, self.vocab, self.name = inner, vocab, inner.name

    def propose(self, session: bytes, committed, m: int, **kw) -> Draft:
        draft = self.inner.propose(session, committed, m, **kw)
        return Draft([(t + 1) % self.vocab for t in draft.tokens], draft.q_rows)

    def release(self, session: bytes) -> None:
        self.inner.release(session)


@dataclass(frozen=True)
class Config:
    rule: int
    rejected: bool
    m: int

    @property
    def sampling(self) -> Sampling | None:
        return Sampling(temperature_milli=800, seed=41) if self.rule == RULE_SPECULATIVE else None


CONFIGS = {"rule1": Config(RULE_GREEDY, False, 3), "rule1-rejected": Config(RULE_GREEDY, True, 3),
           "rule2": Config(RULE_SPECULATIVE, False, 1)}


async def _run(config: Config, session: bytes, kill: tuple[int, int | None] | None, root: str) -> tuple[list[int], object, str]:
    """The session's output, how it ended, and what happened; ``kill`` = (tokens, which drafter,
    None for every one)."""
    network = InProcessNetwork()
    store = embedded(root)
    target = ToyTarget()
    router = RouterRole(uri=ROUTER, mlc=store, transport=network.transport(Peer(ROUTER, PeerRole.ROUTER)),
                        target_digest=TARGET, tokenizer_digest=TOKENIZER, scope=SCOPE, drafter_models={},
                        sweep_interval=0.03)
    verifier = VerifierRole(Slow(target), VerifierConfig(uri=VERIFIER, target_digest=TARGET, router=ROUTER, offload=True,
                                                         backend="reference", batch_wait=0.0, output_wait=0.1,
                                                         status_ttl_ms=TTL_MS),
                            mlc=store, transport=network.transport(Peer(VERIFIER, PeerRole.VERIFIER)))
    drafters = {}
    for uri in DRAFTERS:
        model = ToyDrafter("toy-good", target, 0.5)  # one model: either drafter proposes the same
        drafters[uri] = DrafterRole(Rejected(model, target.vocab_size) if config.rejected else model, uri=uri,
                                    mlc=store, router=ROUTER, fixed_m=config.m, status_ttl_ms=TTL_MS, retries=3,
                                    transport=network.transport(Peer(uri, PeerRole.DRAFTER)))
    network.register(ROUTER, router.handler)
    network.register(VERIFIER, verifier.handler)
    for uri, role in drafters.items():
        network.register(uri, role.handler)
    roles = [router, verifier, *drafters.values()]
    tokens: list[int] = []
    finish = None
    note = "uninterrupted"
    try:
        for role in roles:
            await role.start()
        await verifier.report_status()
        for role in drafters.values():
            await role.report_status()
        await router.open(serving_spec(PROMPT, max_new=MAX_NEW, rule=config.rule, sampling=config.sampling,
                                       session=session))
        stream = router.output(session).__aiter__()
        while True:
            try:
                out = await asyncio.wait_for(stream.__anext__(), SILENCE)
            except StopAsyncIteration:
                break
            except TimeoutError:
                live = verifier.live(session).session
                return tokens, "stalled", f"{note}; stalled at {len(tokens)}: {live.state}, drafter {live.drafter}"
            tokens.extend(out.tokens)
            if out.final:
                finish = out.finish
            if kill is not None and note == "uninterrupted" and len(tokens) >= kill[0]:
                victims = DRAFTERS if kill[1] is None else (DRAFTERS[kill[1]],)
                for victim in victims:
                    network.unregister(victim)  # answers nobody from now on and reports no status
                    await drafters[victim].close()
                note = f"killed {', '.join(victims)} at {len(tokens)}"
    finally:
        for role in roles:
            await role.close()
        store.close()
    return tokens, finish, note


_reference: dict[str, list[int]] = {}


def _uninterrupted(name: str) -> list[int]:
    if name not in _reference:
        with tempfile.TemporaryDirectory() as root:
            tokens, finish, _ = asyncio.run(_run(CONFIGS[name], sid(900), None, root))
        assert finish == Action.FINISH and len(tokens) == MAX_NEW
        _reference[name] = tokens
    return _reference[name]


@pytest.mark.parametrize("point", range(KILLS))
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_a_drafter_killed_at_any_point_neither_stalls_nor_fails_the_session(name: str, point: int, tmp_path) -> None:
    rng = random.Random(f"drafter-kill/{name}/{point}")
    kill = (rng.randint(1, MAX_NEW - 2), rng.randrange(len(DRAFTERS)))
    expected = _uninterrupted(name)
    tokens, finish, note = asyncio.run(asyncio.wait_for(_run(CONFIGS[name], sid(900), kill, str(tmp_path)), 60))
    assert finish == Action.FINISH, f"{name}: {note}: ended {finish}"
    assert tokens == expected, f"{name}: {note}: the text differs from the uninterrupted run's"


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_with_every_drafter_killed_the_verifier_decodes_the_session_itself(name: str, tmp_path, caplog) -> None:
    """No live drafter may take the stalled session: the router takes the drafter away at the
    verifier (DELETE sessions/{id}/drafter), which decodes the rest itself, and says so once.
    Under rule 1 the text is the uninterrupted run's; under rule 2 a self-decoded round is one
    token where a drafted one was up to two, so the rounds, and with them the seeded draws
    (§6.4), differ: the session still ends in finish with max_new tokens."""
    expected = _uninterrupted(name)
    with caplog.at_level(logging.WARNING, logger="sdcp_fast.router"):
        tokens, finish, note = asyncio.run(asyncio.wait_for(_run(CONFIGS[name], sid(900), (MAX_NEW // 3, None),
                                                                 str(tmp_path)), 60))
    assert finish == Action.FINISH, f"{name}: {note}: ended {finish}"
    if CONFIGS[name].rule == RULE_GREEDY:
        assert tokens == expected, f"{name}: {note}: the text differs from the uninterrupted run's"
    assert len(tokens) == MAX_NEW, f"{name}: {note}"
    said = [r.getMessage() for r in caplog.records
            if r.name == "sdcp_fast.router" and "no live drafter" in r.getMessage()]
    if CONFIGS[name].rejected or CONFIGS[name].rule != RULE_GREEDY:
        # The ladder may have chosen self_decode before the kill (every round is low when all are
        # rejected; under rule 2 a run of low rounds can come by chance, and when it comes relative
        # to the kill depends on timing): then nothing stalls and nothing is said.
        assert len(said) <= 1, said
    else:
        assert len(said) == 1 and "the verifier decodes it itself" in said[0], said
