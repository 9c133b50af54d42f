"""``catalog``: the one way from a drafter spec to a drafter, for the toy target and a real one."""

from __future__ import annotations

import pytest

from sdcp_fast.deploy.catalog import load_drafter, load_target, target_of
from sdcp_fast.model import loader
from sdcp_fast.model.contract_digests import model_digest, weights_digest


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
