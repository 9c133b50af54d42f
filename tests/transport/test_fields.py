"""Header fields as handlers see them and as the transports send them."""

from __future__ import annotations

from urllib.parse import urlencode

from sdcp_fast.transport.fields import HOP_BY_HOP, header_dict, outbound_fields, query_string, response_fields


def test_received_fields_are_lower_case_without_pseudo_fields_and_repeats_joined() -> None:
    got = header_dict([(b":path", b"/x"), (b"Accept", b"a"), (b"accept", b"b"), (b"X-One", b"1")])
    assert got == {"accept": "a, b", "x-one": "1"}


def test_sent_fields_leave_the_connection_specific_ones_out() -> None:
    sent = outbound_fields({"Content-Type": "t", "Connection": "close", "TE": "trailers", "Upgrade": "h2c"})
    assert sent == [("content-type", "t")]
    assert outbound_fields(None) == []
    assert {"connection", "transfer-encoding", "keep-alive"} <= HOP_BY_HOP


def test_response_fields_give_the_status_and_the_same_dict() -> None:
    raw = [(b":status", b"204"), (b"Accept", b"a"), (b"accept", b"b"), (b"x-one", b"1")]
    assert response_fields(raw) == (204, header_dict(raw))
    assert response_fields([(b"x", b"y")]) == (0, {"x": "y"})


def test_query_strings_are_urlencodes() -> None:
    for query in ({"from": "3"}, {"from": "12", "wait": "1"}, {"x": "a b/c"}, {"a&b": "c=d"}, {"e": ""},
                  {"": "v"}, {"n": "١٢"}, {"k": "é"}, {}):
        assert query_string(query) == urlencode(query), query
