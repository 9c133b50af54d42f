"""The verifier's session registry (sdcp_fast/protocol/registry.py, draft §6.1, §6.9)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sdcp_fast.protocol.messages import SessionOpen
from sdcp_fast.protocol.problems import BadContract, BadRequest, StaleEpoch, UnknownSession
from sdcp_fast.protocol.registry import SessionRegistry
from sdcp_fast.protocol.session import ScoreNeeded, State
from tests.protocol.sessionkit import DRAFTER, PROMPT, SID, TARGET, assignment, contract, proposal, run_round

OTHER = b"O" * 16


def session_open(epoch=1, session=SID, **overrides):
    message = SessionOpen(session=session, epoch=epoch, contract=contract(), prompt=PROMPT,
                          commit_log="mlc://log")
    return replace(message, **overrides)


def test_open_twice_returns_the_same_session_and_its_current_state():
    registry = SessionRegistry()
    first, state = registry.open(session_open(), target_digest=TARGET)
    first.assign(assignment(first))
    run_round(first, (4, 5), 2, 6)
    again, state2 = registry.open(session_open(), target_digest=TARGET)
    assert again is first and first.drafter == DRAFTER  # nothing reset
    assert (state.round, state.committed) == (0, 0)
    assert (state2.round, state2.committed, state2.digest) == (1, 3, first.digest)
    assert len(registry) == 1 and list(registry) == [first] and SID in registry


def test_same_epoch_different_message_is_bad_request_and_changes_nothing():
    registry = SessionRegistry()
    held, _ = registry.open(session_open(), target_digest=TARGET)
    for changed in (session_open(prompt=(1, 2)), session_open(contract=contract(m_max=3)),
                    session_open(commit_log="mlc://other")):
        with pytest.raises(BadRequest) as info:
            registry.open(changed, target_digest=TARGET)
        assert info.value.extra["session_state"]["epoch"] == 1
    assert registry.get(SID) is held and held.state is State.READY


def test_higher_epoch_reopens_and_the_old_session_refuses_everything():
    registry = SessionRegistry()
    old, _ = registry.open(session_open(), target_digest=TARGET)
    old.assign(assignment(old))
    work = old.receive_proposal(proposal(old, (4,)), client=DRAFTER, now=0)
    assert isinstance(work, ScoreNeeded)
    new, state = registry.open(session_open(epoch=2), target_digest=TARGET)
    assert new is not old and registry.get(SID) is new and state.epoch == 2
    assert old.state is State.FENCED
    for call in (lambda: old.complete_scoring(1, 5), lambda: old.append_done(ok=True),
                 lambda: old.receive_proposal(proposal(old, (4,)), client=DRAFTER, now=0),
                 lambda: old.assign(assignment(old)), lambda: old.output(0), old.self_decode):
        with pytest.raises(StaleEpoch):
            call()
    old.supersede()  # already stopped: nothing more happens
    assert old.state is State.FENCED


def test_lower_epoch_is_stale_and_fenced_session_at_same_epoch_is_stale():
    registry = SessionRegistry()
    registry.open(session_open(epoch=3), target_digest=TARGET)
    with pytest.raises(StaleEpoch) as info:
        registry.open(session_open(epoch=2), target_digest=TARGET)
    assert info.value.extra["session_state"]["epoch"] == 3
    held = registry.get(SID)
    held.assign(assignment(held))
    held.receive_proposal(proposal(held, (4,)), client=DRAFTER, now=0)
    held.complete_scoring(1, 5)
    held.append_done(ok=False, fenced=True)
    with pytest.raises(StaleEpoch):
        registry.open(session_open(epoch=3), target_digest=TARGET)


def test_invalid_reopen_leaves_the_held_session_in_service():
    registry = SessionRegistry()
    held, _ = registry.open(session_open(), target_digest=TARGET)
    with pytest.raises(BadContract):
        registry.open(session_open(epoch=2), target_digest=b"\x00" * 32)
    assert registry.get(SID) is held and held.state is State.READY


def test_unknown_session_get_and_remove():
    registry = SessionRegistry()
    with pytest.raises(UnknownSession) as info:
        registry.get(OTHER)
    assert info.value.status == 404 and info.value.suffix == "sdcp-unknown-session"
    held, _ = registry.open(session_open(session=OTHER), target_digest=TARGET)
    assert registry.remove(OTHER) is held and len(registry) == 0 and OTHER not in registry
    with pytest.raises(UnknownSession):
        registry.remove(OTHER)
    again, _ = registry.open(session_open(session=OTHER), target_digest=TARGET)
    assert again is not held


def test_open_passes_vocab_and_tokens_through():
    registry = SessionRegistry()
    message = session_open(prompt="mlc://prompt")
    session, _ = registry.open(message, target_digest=TARGET, vocab=50, prompt_tokens=PROMPT)
    assert session.vocab == 50 and session.prompt == PROMPT
    with pytest.raises(BadRequest):
        registry.open(session_open(session=OTHER), target_digest=TARGET, vocab=12)  # prompt has 13


def test_an_attached_record_lives_and_goes_with_its_session():
    """The adapter's record of a session is kept in the registry: the one table of what is
    served. None until attached; kept on an idempotent open; gone when a higher epoch replaces
    the session or the session is removed; never attached to a session no longer held."""
    registry: SessionRegistry[str] = SessionRegistry()
    first, _ = registry.open(session_open(), target_digest=TARGET)
    assert registry.attached(SID) is None and registry.records() == []
    registry.attach(first, "log of epoch 1")
    other, _ = registry.open(session_open(session=OTHER), target_digest=TARGET)
    registry.attach(other, "other")
    assert registry.open(session_open(), target_digest=TARGET)[0] is first
    assert registry.attached(SID) == "log of epoch 1" and registry.records() == ["log of epoch 1", "other"]
    second, _ = registry.open(session_open(epoch=2), target_digest=TARGET)
    assert first.state is State.FENCED and registry.attached(SID) is None
    with pytest.raises(UnknownSession):
        registry.attach(first, "late")  # the superseded session's open completed after the new one
    registry.attach(second, "log of epoch 2")
    assert sorted(registry.records()) == ["log of epoch 2", "other"]
    registry.attach(second, None)
    assert registry.attached(SID) is None and registry.records() == ["other"]
    registry.remove(OTHER)
    assert registry.attached(OTHER) is None and registry.records() == []
    assert registry.attached(b"X" * 16) is None


def test_open_records_are_the_attached_sessions_not_closed_in_the_order_last_opened():
    """The scans a verifier makes per scoring pass walk these: sessions that ended (kept for
    their readers) drop out once found closed, a re-opened session comes last, a removed one
    is gone, and a session with no record attached yet is left out as records() leaves it."""
    registry: SessionRegistry[str] = SessionRegistry()
    first, _ = registry.open(session_open(), target_digest=TARGET)
    registry.attach(first, "first")
    other, _ = registry.open(session_open(session=OTHER), target_digest=TARGET)
    assert registry.open_records() == ["first"]  # OTHER's record is not attached yet
    registry.attach(other, "other")
    assert registry.open_records() == ["first", "other"]
    first.assign(assignment(first))
    run_round(first, [2], 1, 5)  # the stop token: the session finishes
    assert first.closed and registry.records() == ["first", "other"]  # still read from
    assert registry.open_records() == ["other"]
    assert registry.open_records() == ["other"]  # found closed once, not walked again
    again, _ = registry.open(session_open(epoch=2), target_digest=TARGET)
    registry.attach(again, "again")
    assert registry.open_records() == ["other", "again"]
    newer, _ = registry.open(session_open(session=OTHER, epoch=2), target_digest=TARGET)
    assert other.closed and registry.open_records() == ["again"]  # superseded: fenced
    registry.attach(newer, "newer")
    assert registry.open_records() == ["again", "newer"]
    registry.remove(SID)
    assert registry.open_records() == ["newer"] and registry.records() == ["newer"]
