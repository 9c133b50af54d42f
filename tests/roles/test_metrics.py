"""Prometheus metrics of the roles: each role instance counts what it did, in its own registry,
served at ``GET metrics`` in the exposition format."""

from __future__ import annotations

from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from sdcp_fast.deploy.local import Engine, SessionSpec, model_digest
from sdcp_fast.model.toy import ToyDrafter, ToyTarget, encode
from sdcp_fast.protocol import Action, Sampling
from sdcp_fast.protocol.messages import RULE_SPECULATIVE
from sdcp_fast.roles.metrics import PASS_PHASES, VerifierMetrics
from sdcp_fast.roles.verifier import RoundInfo
from sdcp_fast.store import embedded
from sdcp_fast.transport import loop
from sdcp_fast.transport.base import Request

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def samples(text: str) -> Samples:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(found: Samples, name: str, **labels: str) -> float:
    return found.get((name, tuple(sorted(labels.items()))), 0.0)


def test_each_role_counts_its_work(tmp_path: Path) -> None:
    target = ToyTarget()
    drafters = [ToyDrafter("good", target, 0.8), ToyDrafter("weak", target, 6.0, seed=3)]
    engine = Engine(target, drafters, embedded(str(tmp_path)), target_digest=model_digest("t"),
                    tokenizer_digest=model_digest("w"), fixed_m=4)
    rounds: list[RoundInfo] = []
    specs = [SessionSpec(encode("the verifier commits"), max_new=20, drafters=("good",)),
             SessionSpec(encode("the router"), max_new=20, drafters=("weak",),
                         fallback=(Action.REDUCE, Action.SWITCH, Action.SELF_DECODE, Action.REDUCE)),
             SessionSpec(encode("a drafter proposes"), max_new=20, rule=RULE_SPECULATIVE, drafters=("good",),
                         sampling=Sampling(temperature_milli=800, seed=1))]

    async def scenario() -> tuple[dict[str, Samples], dict[str, str], int]:
        async with engine.deployment(rounds.append) as d:
            opened = [await d.router.open(engine._spec(spec, i)) for i, spec in enumerate(specs)]
            for routed in opened:
                await d.router.text(routed.session)
            bad = await d.verifier.handler(Request("POST", "proposals", body=b"\xff",
                                                   headers={"content-type": "application/sdcp+cbor"}))
            assert bad.status == 400
            found, types = {}, {}
            for name, role in [("router", d.router), ("verifier", d.verifier),
                               *((n, r) for n, r in d.drafters.items())]:
                response = await role.handler(Request("GET", "metrics"))
                assert response.status == 200
                types[name] = response.content_type
                found[name] = samples(response.body.decode())
            return found, types, d.verifier.target_passes

    found, types, passes = loop.run(scenario())
    assert all(t.startswith("text/plain") for t in types.values())
    v, r = found["verifier"], found["router"]
    drafted = [x for x in rounds if x.drafter is not None]
    assert value(v, "sdcp_rounds_total") == len(rounds)
    assert value(v, "sdcp_self_decoded_rounds_total") == len(rounds) - len(drafted)
    assert value(v, "sdcp_accepted_tokens_total") == sum(x.accepted for x in drafted)
    assert value(v, "sdcp_proposed_tokens_total") == sum(x.proposed for x in drafted)
    assert value(v, "sdcp_emitted_tokens_total") == sum(len(x.emitted) for x in rounds)
    assert value(v, "sdcp_verdict_latency_seconds_count") == len(drafted)
    assert value(v, "sdcp_batch_size_count") == passes
    assert value(v, "sdcp_batch_size_sum") == sum(1 for _ in rounds)  # every round was in one pass
    # Each pass counts every phase of its time once (one it did not reach as no time).
    for phase in PASS_PHASES:
        assert value(v, "sdcp_pass_phase_seconds_count", phase=phase) == passes
        assert value(v, "sdcp_pass_phase_seconds_sum", phase=phase) >= 0
    assert value(v, "sdcp_pass_phase_seconds_sum", phase="append") > 0  # the rounds' records went to a log
    for action in (Action.REDUCE, Action.SWITCH, Action.SELF_DECODE):
        # Escalations are verdicts of proposed rounds; a self-decoded round's says the period goes on.
        expected = sum(1 for x in drafted if Action.parse(int(x.action)) == action)
        assert value(v, "sdcp_escalations_total", action=action.name.lower()) == expected
    assert value(v, "sdcp_escalations_total", action="reduce") >= 1  # the weak drafter escalates
    rule2_rounds = [x for x in drafted if x.session == engine._spec(specs[2], 2).session]
    assert value(v, "sdcp_mlc_q_rows_total", result="hit") == len(rule2_rounds) > 0
    assert value(v, "sdcp_problems_total", type="sdcp-bad-request") == 1
    assert value(r, "sdcp_sessions_opened_total") == 3
    assert value(r, "sdcp_assignments_total") >= 3
    assert value(r, "sdcp_failovers_total") == 0
    proposals = sum(value(found[n], "sdcp_proposals_total") for n in ("good", "weak"))
    assert proposals >= len(drafted)  # a proposal left unanswered by a switch is not a round
    assert value(found["weak"], "sdcp_drafted_tokens_total") >= 1


def test_instances_in_one_process_do_not_collide() -> None:
    first, second = VerifierMetrics(), VerifierMetrics()
    first.batch(3)
    assert value(samples(first.text()), "sdcp_batch_size_count") == 1
    assert value(samples(second.text()), "sdcp_batch_size_count") == 0


def test_a_pass_counts_its_rounds_as_each_round_would() -> None:
    from types import SimpleNamespace

    done = [(SimpleNamespace(emitted=(1, 2, 3), accepted=2, action=Action.CONTINUE), 4, 0.0),
            (SimpleNamespace(emitted=(4,), accepted=0, action=Action.REDUCE), 4, 0.0),
            (SimpleNamespace(emitted=(5,), accepted=0, action=Action.SELF_DECODE), 0, None),  # self-decoded
            (SimpleNamespace(emitted=(6, 7), accepted=1, action=9), 2, 0.0)]  # unknown action: read as fail
    one_by_one, together = VerifierMetrics(), VerifierMetrics()
    for verdict, proposed, started in done:
        one_by_one.round(verdict, proposed, started)
    together.pass_committed([(v, m, None if started is None else 0.001) for v, m, started in done])
    expected, got = samples(one_by_one.text()), samples(together.text())
    for name, labels in [("sdcp_rounds_total", {}), ("sdcp_emitted_tokens_total", {}),
                         ("sdcp_proposed_tokens_total", {}), ("sdcp_accepted_tokens_total", {}),
                         ("sdcp_self_decoded_rounds_total", {}), ("sdcp_escalations_total", {"action": "reduce"}),
                         ("sdcp_escalations_total", {"action": "fail"}), ("sdcp_verdict_latency_seconds_count", {})]:
        assert value(got, name, **labels) == value(expected, name, **labels), name
    assert value(got, "sdcp_rounds_total") == 4 and value(got, "sdcp_escalations_total", action="fail") == 1


def test_the_phase_totals_are_what_the_exposition_shows() -> None:
    metrics = VerifierMetrics()
    for seconds in (0.002, 0.005):
        for phase in PASS_PHASES:
            metrics.phase(phase, seconds * (1 + PASS_PHASES.index(phase)))
    found, totals = samples(metrics.text()), metrics.phase_totals()
    assert list(totals) == list(PASS_PHASES)
    for phase, (passes, seconds) in totals.items():
        assert passes == value(found, "sdcp_pass_phase_seconds_count", phase=phase) == 2
        assert seconds == value(found, "sdcp_pass_phase_seconds_sum", phase=phase)
        assert abs(seconds - 0.007 * (1 + PASS_PHASES.index(phase))) < 1e-12
