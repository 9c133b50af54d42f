"""Routing records (sdcp_fast/protocol/routing_records.py; docs/interpretations.md, "Routing records"):
what a router writes to the MLC for each session, read back by any router, and the
adoption decision."""

from __future__ import annotations

import json

import pytest

from sdcp_fast.protocol.messages import Policy, Resume, Sampling
from sdcp_fast.protocol.routing import RoutedSession, open_message
from sdcp_fast.protocol.routing_records import (
    RECORD_FORMAT,
    adoption,
    decode_index,
    decode_record,
    encode_index,
    encode_record,
    index_id,
    record_of,
    routed_from,
)
from tests.protocol.sessionkit import PROMPT, SID, VERIFIER, contract

ROUTER = "https://router.test/"


def routed(**overrides):
    fields = dict(session=SID, epoch=3, contract=contract(), prompt=PROMPT, commit_log="mlc://log",
                  verifier=VERIFIER, round=5, committed=9, digest=b"\x09" * 32, m_init=4, drafter="https://d.test/",
                  committed_tokens="mlc://tokens/3")
    fields.update(overrides)
    return RoutedSession(**fields)


def a_record(**overrides):
    r = routed(**overrides)
    resume = Resume(round=5, committed=9, digest=b"\x09" * 32, committed_tokens="mlc://tokens/2")
    r.policies = [Policy(session=SID, from_round=2, sampling=Sampling(temperature_milli=700, seed=1))]
    r.sampling = r.policies[-1].sampling
    return r, record_of(r, router=ROUTER, opened=open_message(r, resume=resume),
                        writers={1: "https://v1.test/", 3: VERIFIER}, request={"prompt": "hi", "stream": True})


def test_a_record_reads_back_as_written_and_gives_the_routed_session():
    r, record = a_record()
    back = decode_record(encode_record(record))
    assert back == record
    assert back.session == SID and back.epoch == 3 and back.router == ROUTER
    again = routed_from(back)
    assert (again.session, again.epoch, again.verifier, again.drafter, again.contract, again.prompt) == (
        r.session, r.epoch, r.verifier, r.drafter, r.contract, r.prompt)
    # Before its verifier answers, the adopted session stands where the resume put it.
    assert (again.round, again.committed, again.digest) == (5, 9, b"\x09" * 32)
    assert again.policies == r.policies and again.sampling == r.sampling and not again.done


def test_the_record_is_json_naming_its_format_session_and_router():
    _, record = a_record()
    body = json.loads(encode_record(record))
    assert body["format"] == RECORD_FORMAT and body["session"] == SID.hex() and body["router"] == ROUTER
    assert body["writers"] == {"1": "https://v1.test/", "3": VERIFIER} and body["request"]["prompt"] == "hi"


@pytest.mark.parametrize("data", [
    b"", b"\xff\xfe", b"[]", b'{"format": "something-else/1"}', json.dumps({"format": RECORD_FORMAT}).encode(),
])
def test_anything_else_is_not_a_record(data):
    with pytest.raises(ValueError):
        decode_record(data)


def test_a_record_whose_fields_disagree_with_its_session_open_is_refused():
    _, record = a_record()
    body = json.loads(encode_record(record))
    body["session"] = "00" * 16
    with pytest.raises(ValueError, match="disagrees"):
        decode_record(json.dumps(body).encode())
    body = json.loads(encode_record(record))
    body["open"] = "not-cbor"
    with pytest.raises(ValueError, match="malformed"):
        decode_record(json.dumps(body).encode())


def test_adoption_takes_live_sessions_only_and_at_a_restart_only_its_own():
    _, record = a_record()
    assert adoption(record, ROUTER, claim=False) is None
    assert adoption(record, ROUTER.rstrip("/"), claim=False) is None  # a trailing slash is not significant
    assert "routes it now" in adoption(record, "https://other.test/", claim=False)
    assert adoption(record, "https://other.test/", claim=True) is None  # a client resumes there
    _, done = a_record(done=True)
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
