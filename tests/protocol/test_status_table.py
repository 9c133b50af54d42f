"""The router's status table and its choice of drafter and verifier
(sdcp_fast/protocol/status_table.py, draft §6.1, §6.6)."""

from __future__ import annotations

from sdcp_fast.protocol.status_table import StatusTable, choose_drafter, choose_verifier
from tests.protocol.sessionkit import MODEL_A, MODEL_B, contract, status, table_with


def test_status_ttl_expiry():
    table = table_with(status("a", ttl_ms=500), status("v", role=2, ttl_ms=2000))
    assert table.live("a", 0.49) and not table.live("a", 0.5) and not table.live("zz", 0)
    assert table.status("a", 0.1).load == 10 and table.status("a", 0.6) is None
    assert [s.instance for s in table.live_drafters(0.1)] == ["a"]
    assert table.next_expiry() == 0.5
    assert table.expire(1.0) == ["a"] and table.expire(1.0) == []
    assert table.next_expiry() == 2.0
    assert StatusTable().next_expiry() is None
    assert table.model_of("a") == MODEL_A and table.model_of("zz") is None


def test_choose_prefers_low_load_then_queue_then_acceptance():
    table = table_with(status("a", load=50), status("b", load=20, queue=3), status("c", load=20, queue=1),
                       status("d", load=20, queue=1, accept=900), status("v", load=0, role=2))
    assert choose_drafter(table, contract(), 0.0) == "d"
    assert choose_drafter(table, contract(), 0.0, exclude=("d",)) == "c"
    assert choose_drafter(table, contract(), 5.0) is None  # all expired: never assigned


def test_choose_respects_contract_drafters():
    table = table_with(status("a", load=0), status("b", load=90), models={"a": MODEL_A, "b": MODEL_B})
    table.report(status("anon", load=0), 0.0)  # no registered model
    assert choose_drafter(table, contract(drafters=(MODEL_B,)), 0.0) == "b"
    assert choose_drafter(table, contract(drafters=(bytes(32),)), 0.0) is None
    assert choose_drafter(table, contract(), 0.0) in ("a", "anon")


def test_choose_verifier_least_load_then_queue_then_name():
    table = table_with(status("v3", role=2, load=10, queue=0), status("v2", role=2, load=5, queue=4),
                       status("v1", role=2, load=5, queue=4), status("v0", role=2, load=5, queue=9),
                       status("d", role=1, load=0))
    assert [s.instance for s in table.live_verifiers(0.0)] == ["v3", "v2", "v1", "v0"]
    assert choose_verifier(table, 0.0) == "v1"
    assert choose_verifier(table, 0.0, exclude=("v1", "v2")) == "v0"
    assert choose_verifier(table, 0.0, exclude=("v0", "v1", "v2", "v3")) is None
    assert choose_verifier(table, 5.0) is None  # every status expired
