"""Routing records (sdcp_fast/protocol/routing_records.py; docs/interpretations.md, "Routing records"):
the encoding of a routed session that a router writes to the MLC for each session, read back
by any router, and the adoption decision."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from sdcp_fast.protocol.messages import Policy, Resume, Sampling, SessionOpen
from sdcp_fast.protocol.routing import RoutedSession, Watch
from sdcp_fast.protocol.routing_records import (
    RECORD_FORMAT,
    adoption,
    decode_index,
    decode_record,
    encode_index,
    encode_record,
    index_id,
)
from tests.protocol.sessionkit import PROMPT, SID, VERIFIER, contract

ROUTER = "https://router.test/"
V1 = Path(__file__).parent / "routing_v1"  # records as routers wrote them in format sdcp-fast-routing/1


def a_record(**overrides):
    """A session at epoch 3, resumed there, whose verifier went on to round 7."""
    resume = Resume(round=5, committed=9, digest=b"\x09" * 32, committed_tokens="mlc://tokens/2")
    policies = [Policy(session=SID, from_round=2, sampling=Sampling(temperature_milli=700, seed=1))]
    fields = dict(
        opened=SessionOpen(session=SID, epoch=3, contract=contract(), prompt=PROMPT, commit_log="mlc://log",
                           resume=resume),
        epoch=3, verifier=VERIFIER, m_init=4, round=7, committed=12, digest=b"\x0c" * 32, drafter="https://d.test/",
        router=ROUTER, writers={1: "https://v1.test/", 3: VERIFIER}, sampling=policies[-1].sampling,
        policies=policies, committed_tokens="mlc://tokens/3", request={"prompt": "hi", "stream": True},
        watch=Watch(tried={"https://e.test/"}, progress=4.0, seen=12, self_decoding=True))
    fields.update(overrides)
    return RoutedSession(**fields)


def test_a_record_reads_back_as_the_routed_session_at_its_open():
    r = a_record()
    back = decode_record(encode_record(r))
    # What persists comes back as it was; where the session stands starts at the open's resume,
    # and the router's own bookkeeping starts afresh.
    assert back == replace(r, round=5, committed=9, digest=b"\x09" * 32, watch=Watch())
    assert back.session == SID and back.epoch == 3 and back.router == ROUTER
    assert (back.contract, back.prompt, back.commit_log) == (r.contract, r.prompt, r.commit_log)
    assert encode_record(back) == encode_record(r)


def test_a_record_encoded_mid_failover_names_the_epoch_its_verifier_holds():
    r = a_record(epoch=4, verifier="https://next.test/")  # the next epoch, its open not answered yet
    back = decode_record(encode_record(r))
    assert back.epoch == 3 and back.opened == r.opened and back.verifier == "https://next.test/"


def test_a_fresh_session_decodes_at_its_start():
    opened = SessionOpen(session=SID, epoch=1, contract=contract(), prompt="text", commit_log="mlc://log")
    back = decode_record(encode_record(RoutedSession(opened=opened, epoch=1, verifier=VERIFIER, m_init=2,
                                                     round=3, committed=4, digest=b"\x04" * 32)))
    assert (back.round, back.committed, back.digest, back.drafter, back.policies) == (0, 0, bytes(32), None, [])


def test_records_written_in_format_1_still_decode_and_encode_to_the_same_bytes():
    resumed = (V1 / "resumed.json").read_bytes()
    r = decode_record(resumed)
    assert (r.session, r.epoch, r.verifier, r.drafter, r.router, r.m_init) == (
        SID, 3, VERIFIER, "https://d.test/", ROUTER, 4)
    assert (r.round, r.committed, r.digest) == (5, 9, b"\x09" * 32)
    assert r.opened.resume == Resume(round=5, committed=9, digest=b"\x09" * 32, committed_tokens="mlc://tokens/2")
    assert r.contract == contract() and r.prompt == PROMPT and r.commit_log == "mlc://log"
    assert r.writers == {1: "https://v1.test/", 3: VERIFIER} and r.committed_tokens == "mlc://tokens/3"
    assert [p.from_round for p in r.policies] == [2, 9] and r.sampling == Sampling(temperature_milli=300, seed=1)
    assert r.request == {"max_tokens": 12, "prompt": "hi", "stream": True} and not r.done
    assert adoption(r, ROUTER, claim=False) is None
    fresh = decode_record((V1 / "fresh.json").read_bytes())
    assert (fresh.session, fresh.epoch, fresh.prompt, fresh.opened.resume, fresh.drafter) == (
        b"\x01" * 16, 1, "some text", None, None)
    assert fresh.done and fresh.request is None and fresh.sampling is None and fresh.writers == {1: VERIFIER}
    assert adoption(fresh, "https://router.test/", claim=False) == "it finished"
    for data in (resumed, (V1 / "fresh.json").read_bytes()):
        assert encode_record(decode_record(data)) == data


def test_the_record_is_json_naming_its_format_session_and_router():
    body = json.loads(encode_record(a_record()))
    assert body["format"] == RECORD_FORMAT and body["session"] == SID.hex() and body["router"] == ROUTER
    assert body["writers"] == {"1": "https://v1.test/", "3": VERIFIER} and body["request"]["prompt"] == "hi"
    assert set(body) == {"format", "session", "epoch", "router", "verifier", "drafter", "open", "writers",
                         "committed_tokens", "policies", "sampling", "m_init", "done", "request"}


@pytest.mark.parametrize("data", [
    b"", b"\xff\xfe", b"[]", b'{"format": "something-else/1"}', json.dumps({"format": RECORD_FORMAT}).encode(),
])
def test_anything_else_is_not_a_record(data):
    with pytest.raises(ValueError):
        decode_record(data)


def test_a_record_whose_fields_disagree_with_its_session_open_is_refused():
    record = a_record()
    body = json.loads(encode_record(record))
    body["session"] = "00" * 16
    with pytest.raises(ValueError, match="disagrees"):
        decode_record(json.dumps(body).encode())
    for member, value in (("open", "not-cbor"), ("open", 5), ("verifier", 5), ("writers", [])):
        body = json.loads(encode_record(record))
        body[member] = value
        with pytest.raises(ValueError, match="malformed"):
            decode_record(json.dumps(body).encode())


def test_adoption_takes_live_sessions_only_and_at_a_restart_only_its_own():
    record = a_record()
    assert adoption(record, ROUTER, claim=False) is None
    assert adoption(record, ROUTER.rstrip("/"), claim=False) is None  # a trailing slash is not significant
    assert "routes it now" in adoption(record, "https://other.test/", claim=False)
    assert adoption(record, "https://other.test/", claim=True) is None  # a client resumes there
    done = a_record(done=True)
    assert adoption(done, ROUTER, claim=False) == "it finished"
    assert adoption(done, ROUTER, claim=True) is None  # its output is still the client's


def test_the_index_reads_back_and_is_named_per_router():
    sessions = [bytes([i]) * 16 for i in range(3)]
    assert sorted(decode_index(encode_index(ROUTER, sessions))) == sorted(sessions)
    assert index_id(ROUTER) == index_id(ROUTER.rstrip("/")) != index_id("https://other.test/")
    assert len(index_id(ROUTER)) == 16
    for bad in (b"{}", b"nonsense", json.dumps({"format": "sdcp-fast-routing-index/1", "sessions": ["ab"]}).encode()):
        with pytest.raises(ValueError):
            decode_index(bad)
