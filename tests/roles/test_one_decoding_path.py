"""One decoding path: ``generate``, the demo and a direct run of the three roles give
the same seeded rule-2 text when given the same prompt, contract, session id and M, because
all three are the roles on the in-process transport and rule 2 draws the verifier's HMAC
randoms (§6.4) from the contract's seed and the session id."""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
from dataclasses import replace

from sdcp_fast.cli import demo as demo_module
from sdcp_fast.cli import main
from sdcp_fast.deploy.local import drafter_uri, generate, model_digest, session_id_for, spec_for
from sdcp_fast.model.toy import ToyDrafter, ToyTarget, encode
from sdcp_fast.protocol import Sampling
from sdcp_fast.protocol.peer import Peer, PeerRole
from sdcp_fast.roles.drafter import DrafterRole
from sdcp_fast.roles.router import RouterRole
from sdcp_fast.roles.verifier import VerifierConfig, VerifierRole
from sdcp_fast.store import embedded
from sdcp_fast.transport.inprocess import InProcessNetwork

from .rolekit import run

SEED, M, MAX_NEW, TEMPERATURE = 5, 4, 40, 800
PROMPT = encode(demo_module.TOY_PROMPTS[0])
# The demo's contract: its toy digests and the in-process scope.
TARGET, TOKENIZER = model_digest("toy-target"), model_digest("toy-words")
SCOPE = hashlib.sha256(b"sdcp-fast-inprocess").digest()[:16]


def in_process_flag() -> list[str]:
    """The demo's in-process mode: ``--inprocess`` where the demo defaults to the services."""
    parser = argparse.ArgumentParser()
    demo_module.add_arguments(parser)
    _, unknown = parser.parse_known_args(["--inprocess"])
    return [] if unknown else ["--inprocess"]


def sampling() -> Sampling:
    return Sampling(temperature_milli=TEMPERATURE, seed=SEED)  # the demo's first session: seed + 0


def good(target: ToyTarget) -> ToyDrafter:
    return ToyDrafter("toy-good", target, 0.8)  # the demo's toy-good drafter


async def direct(root: str) -> tuple[list[int], bytes]:
    """The three roles wired by hand, as the services wire them, on the in-process transport."""
    target = ToyTarget()
    network = InProcessNetwork()
    mlc = embedded(root)
    router_uri, verifier_uri, draft = "inproc://r/", "inproc://v/", good(target)
    d_uri = drafter_uri(draft.name)
    router = RouterRole(uri=router_uri, mlc=mlc, transport=network.transport(Peer(router_uri, PeerRole.ROUTER)),
                        target_digest=TARGET, tokenizer_digest=TOKENIZER, scope=SCOPE,
                        drafter_models={d_uri: model_digest(draft.name)})
    verifier = VerifierRole(target, VerifierConfig(uri=verifier_uri, target_digest=TARGET, router=router_uri), mlc=mlc,
                            transport=network.transport(Peer(verifier_uri, PeerRole.VERIFIER)))
    drafter = DrafterRole(draft, uri=d_uri, mlc=mlc, router=router_uri, seed=SEED, fixed_m=M,
                          transport=network.transport(Peer(d_uri, PeerRole.DRAFTER)))
    for uri, role in ((router_uri, router), (verifier_uri, verifier), (d_uri, drafter)):
        network.register(uri, role.handler)
    try:
        for role in (verifier, drafter):
            await role.start()
            await role.report_status()
        spec = replace(spec_for(PROMPT, max_new=MAX_NEW, rule=2, sampling=sampling(), m=M),
                       session=session_id_for(SEED, 0))
        routed = await router.open(spec)
        tokens, _ = await asyncio.wait_for(router.text(routed.session), 15.0)
        return tokens, verifier.sessions.get(routed.session).digest
    finally:
        for role in (drafter, verifier, router):
            await role.close()
        mlc.close()


def test_generate_the_demo_and_the_roles_give_the_same_seeded_rule2_text(tmp_path, capsys):
    """§6.4 rule 2 with a seed: the same text on every path into the roles (the demo given the
    one drafter generate is given)."""
    code = main(["demo", *in_process_flag(), "--model", "toy", "--drafters", "toy-good", "--rule", "2", "--seed", str(SEED),
                 "--m", str(M), "--json", "--sessions", "1", "--max-new", str(MAX_NEW), "--temperature", str(TEMPERATURE / 1000),
                 "--no-baseline"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0
    [from_demo] = report["sessions"]

    target = ToyTarget()
    [from_generate] = generate(target, good(target), [PROMPT], MAX_NEW, m=M, rule=2, sampling=sampling(),
                               seed=SEED)
    tokens, digest = run(direct(str(tmp_path)))

    assert len(tokens) == MAX_NEW and from_generate.chain_ok and from_demo["chain_ok"]
    assert from_demo["tokens"] == from_generate.tokens == tokens
    assert from_demo["digest"] == digest.hex()  # same contract, same session id: same chain
    # The seed matters: another one changes the text (the comparison above is not vacuous).
    [other] = generate(target, good(target), [PROMPT], MAX_NEW, m=M, rule=2,
                       sampling=replace(sampling(), seed=SEED + 1), seed=SEED)
    assert other.tokens != tokens
