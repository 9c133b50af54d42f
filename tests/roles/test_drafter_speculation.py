"""§6.2: a drafter MAY prepare its next proposal assuming full acceptance, and sends it only
after the verdict confirms that assumption."""

from __future__ import annotations

import asyncio

from sdcp_fast.deploy.local import Engine, model_digest
from sdcp_fast.model.interfaces import ScoreRequest
from sdcp_fast.model.toy import ToyDrafter, ToyTarget, encode
from sdcp_fast.roles.router import SessionSpec
from sdcp_fast.store import embedded


def greedy(target: ToyTarget, prompt: list[int], n: int) -> list[int]:
    out: list[int] = []
    for _ in range(n):
        out.append(int(target.score([ScoreRequest(b"g" * 16, [*prompt, *out], [])])[0][0].argmax()))
    return out


def run(tmp_path, drafter_noise: float, speculate: bool) -> tuple[list[int], dict[str, int], list[int]]:
    target = ToyTarget()
    engine = Engine(target, [ToyDrafter("d", target, drafter_noise)], embedded(str(tmp_path)),
                    target_digest=model_digest("t"), tokenizer_digest=model_digest("w"), fixed_m=3)
    prompt = encode("the verifier commits")

    async def scenario() -> tuple[list[int], dict[str, int]]:
        async with engine.deployment() as d:
            role = d.drafters["d"]
            role.speculate = speculate
            routed = await d.router.open(engine._spec(SessionSpec(prompt, max_new=30), 0))
            tokens, _ = await d.router.text(routed.session)
            return tokens, dict(role.speculation)

    tokens, counts = asyncio.run(scenario())
    return tokens, counts, greedy(target, prompt, 30)


def test_prepared_proposals_are_sent_only_when_the_verdict_confirms_them(tmp_path) -> None:
    tokens, counts, expected = run(tmp_path, 0.0, speculate=True)  # the drafter is the target: all accepted
    assert tokens == expected
    assert counts["prepared"] > 0 and counts["used"] > 0


def test_a_wrong_guess_costs_a_redraft_never_a_wrong_token(tmp_path) -> None:
    tokens, counts, expected = run(tmp_path, 6.0, speculate=True)  # a weak drafter: most guesses fail
    # Rule 1: what is committed is the target's greedy decoding (the ladder may end the session early).
    assert tokens and tokens == expected[: len(tokens)]
    assert counts["prepared"] > counts["used"]


def test_without_speculation_nothing_is_prepared(tmp_path) -> None:
    tokens, counts, expected = run(tmp_path, 0.8, speculate=False)
    assert tokens == expected and counts == {"prepared": 0, "used": 0}


def test_a_seeded_rule2_run_is_the_same_with_and_without_speculation(tmp_path) -> None:
    """The guess draws randoms of its own; the prepared draft takes the next round's: a confirmed
    preparation proposes exactly what drafting after the verdict would have (§6.4 seeds repeat)."""
    from sdcp_fast.protocol import Sampling

    texts = []
    for speculate in (False, True):
        target = ToyTarget()
        engine = Engine(target, [ToyDrafter("d", target, 0.3)], embedded(str(tmp_path / str(speculate))),
                        target_digest=model_digest("t"), tokenizer_digest=model_digest("w"), fixed_m=3, seed=5)

        async def scenario(engine: Engine = engine, speculate: bool = speculate) -> tuple[list[int], int]:
            async with engine.deployment() as d:
                d.drafters["d"].speculate = speculate
                spec = SessionSpec(encode("the verifier commits"), max_new=40, rule=2,
                                   sampling=Sampling(temperature_milli=800, seed=11))
                routed = await d.router.open(engine._spec(spec, 0))
                tokens, _ = await d.router.text(routed.session)
                return tokens, d.drafters["d"].speculation["used"]

        texts.append(asyncio.run(scenario()))
    assert texts[0][0] == texts[1][0] and len(texts[0][0]) == 40
    assert texts[1][1] > 0  # prepared proposals were used
