"""``catalog``: the one way from a drafter spec to a drafter, for the toy target and a real one."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

import pytest

from sdcp_fast.cli import verifier
from sdcp_fast.deploy.catalog import load_drafter, load_target, target_of
from sdcp_fast.model import loader
from sdcp_fast.model.contract_digests import model_digest, weights_digest
from sdcp_fast.protocol.peer import Peer, PeerRole
from sdcp_fast.store import embedded
from sdcp_fast.transport.inprocess import InProcessNetwork


def test_every_spec_of_a_real_target() -> None:
    target = load_target("tiny-target")
    ngram, digest = load_drafter("ngram", target)
    assert ngram.name == "ngram" and digest == model_digest("tiny-target/ngram")
    skip, digest = load_drafter("layerskip:2", target)
    assert skip.name == "layerskip:2" and skip.runner.model is target.loaded.model  # type: ignore[attr-defined]
    assert digest == model_digest("tiny-target/layerskip:2")  # the target's own weights
    draft, digest = load_drafter("model:tiny-draft", target)
    assert draft.name == "model:tiny-draft" and draft.runner.model is not target.loaded.model  # type: ignore[attr-defined]
    assert digest == weights_digest(draft.runner.model)  # type: ignore[attr-defined]  # a model of its own
    for bad, words in (("none", "no drafter"), ("beam:3", "unknown drafter")):
        with pytest.raises(ValueError, match=words):
            load_drafter(bad, target)


def test_a_model_loaded_elsewhere_is_the_same_target() -> None:
    """``target_of`` wraps a model loaded without the catalog (a test's, a script's): the same
    digests and drafters as the catalog's own load of it."""
    mine = target_of("tiny-target", loader.load("tiny-target"))
    theirs = load_target("tiny-target")
    assert (mine.digest, mine.tokenizer_digest, mine.stop) == (theirs.digest, theirs.tokenizer_digest, theirs.stop)
    assert load_drafter("model:tiny-draft", mine)[1] == load_drafter("model:tiny-draft", theirs)[1]


def test_toy_specs() -> None:
    target = load_target("toy")
    assert {load_drafter(spec, target)[0].name for spec in ("toy-good", "toy-weak")} == {"toy-good", "toy-weak"}
    with pytest.raises(ValueError, match="unknown toy drafter"):
        load_drafter("layerskip:2", target)


@pytest.mark.parametrize(("model", "inline"), [("toy", True), ("tiny-target", False)])
def test_a_verifier_service_scores_on_its_loop_only_where_a_pass_costs_less_than_a_thread_hop(
        tmp_path: Path, model: str, inline: bool) -> None:
    """The toy's pass (a few microseconds a round) runs on the verifier's loop: handing it to
    the scoring thread and back cost the verifier more CPU than the pass. A real model's pass
    stays off the loop."""
    parser = argparse.ArgumentParser()
    verifier.add_arguments(parser)
    args = parser.parse_args(["--model", model, "--uri", "https://127.0.0.1:8501/", "--router", "https://127.0.0.1:8500/"])
    target = load_target(model)
    assert target.inline is inline
    role = verifier._role(args, target, embedded(str(tmp_path)),
                          InProcessNetwork().transport(Peer(args.uri, PeerRole.VERIFIER)))
    try:
        assert role.config.offload is not inline
    finally:
        asyncio.run(role.close())
