"""Conformance: §6.7 Output Delivery."""

from __future__ import annotations

from sdcp_fast.protocol.messages import Action, Output
from tests.spec.s6kit import DRAFTER, contract, open_session, proposal, run_round


def test_only_tokens_whose_commit_record_was_written_are_returned() -> None:
    """§6.7: only tokens whose commit record has been written are returned."""
    session = open_session()
    run_round(session, (4,), 1, 5)
    session.receive_proposal(proposal(session, (6,)), client=DRAFTER, now=0)
    session.complete_scoring(1, 7)
    assert session.output(0).tokens == (4, 5)
    session.append_done(ok=False)
    assert session.output(0).tokens == (4, 5)


def test_indices_are_stable_and_output_carries_the_epoch() -> None:
    """§6.7: GET output?from=n returns the tokens at output indices n and later; indices are stable
    and every output message carries the session epoch."""
    session = open_session(epoch=3)
    run_round(session, (4, 5), 2, 6)
    first = session.output(1)
    run_round(session, (7,), 1, 8)
    again = session.output(1)
    assert first.tokens == (5, 6) and again.tokens[:2] == first.tokens and again.tokens == (5, 6, 7, 8)
    assert {first.epoch, again.epoch, session.output(5).epoch} == {3}
    assert session.output(5).tokens == () and not session.output(5).final
    assert Output.decode(again.encode()) == again


def test_final_output_has_final_true_and_finish() -> None:
    """§6.7: the final output message has final set to true and finish "finish" or "fail"."""
    session = open_session(contract(stop=(2,)))
    run_round(session, (4, 2), 2, 9)
    out = session.output(0)
    assert out.final and out.finish is Action.FINISH and out.tokens == (4, 2)
    session = open_session(contract(low_rounds=1, fallback=(5,)))
    run_round(session, (4,), 0, 1)
    out = session.output(0)
    assert out.final and out.finish is Action.FAIL
