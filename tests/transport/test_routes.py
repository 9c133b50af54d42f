"""The route table every server shares (sdcp_fast/transport/routes.py)."""

from __future__ import annotations

import pytest

from sdcp_fast.transport.routes import NoRoute, RouteTable


def table() -> RouteTable[str]:
    t = RouteTable[str]()
    t.add("GET", r"objects/(?P<name>.+)", "get")
    t.add("PUT", r"objects/(?P<name>.+)", "put")
    t.add("POST", r"leases", "lease")
    return t


def test_the_method_and_the_whole_path_pick_the_endpoint_and_its_groups():
    assert table().match("PUT", "objects/a/b") == ("put", {"name": "a/b"})
    assert table().match("POST", "leases") == ("lease", {})


def test_a_path_no_pattern_takes_has_no_allowed_methods_and_a_wrong_method_lists_them():
    with pytest.raises(NoRoute) as missing:
        table().match("POST", "leases/x")  # patterns match whole paths only
    assert missing.value.allowed == ()
    with pytest.raises(NoRoute) as wrong:
        table().match("DELETE", "objects/a")
    assert wrong.value.allowed == ("GET", "PUT")


def test_answers_are_the_same_when_asked_again_and_after_a_route_is_added():
    t = table()
    for _ in range(2):
        endpoint, groups = t.match("GET", "objects/a")
        assert (endpoint, groups) == ("get", {"name": "a"})
        groups["name"] = "changed"  # the caller's own copy
        with pytest.raises(NoRoute) as wrong:
            t.match("DELETE", "objects/a")
        assert wrong.value.allowed == ("GET", "PUT")
    t.add("DELETE", r"objects/(?P<name>.+)", "delete")
    assert t.match("DELETE", "objects/a") == ("delete", {"name": "a"})


def test_the_memo_of_answers_stays_bounded(monkeypatch):
    monkeypatch.setattr("sdcp_fast.transport.routes.MEMO_SIZE", 8)
    t = table()
    for i in range(20):
        assert t.match("GET", f"objects/{i}") == ("get", {"name": str(i)})
        assert len(t._memo) <= 8
