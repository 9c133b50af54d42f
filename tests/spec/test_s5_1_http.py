"""Conformance: §5.1 HTTP Usage (the parts the sans-I/O core owns)."""

from __future__ import annotations

import json

import pytest

from sdcp_fast.protocol.messages import MEDIA_TYPE, parse_session_path_id, session_path_id
from sdcp_fast.protocol.problems import BY_SUFFIX, PROBLEM_MEDIA_TYPE, BadRequest


def test_message_bodies_use_media_type_application_sdcp_cbor() -> None:
    """§5.1: message bodies use the media type "application/sdcp+cbor"."""
    assert MEDIA_TYPE == "application/sdcp+cbor"


@pytest.mark.parametrize("suffix", sorted(BY_SUFFIX))
def test_errors_use_problem_details(suffix: str) -> None:
    """§5.1: errors use Problem Details [RFC9457]: a JSON object with type, title, status and detail."""
    body = json.loads(BY_SUFFIX[suffix]("why").render())
    assert body["type"].endswith(suffix) and body["status"] == BY_SUFFIX[suffix].status
    assert isinstance(body["title"], str) and body["detail"] == "why"
    assert PROBLEM_MEDIA_TYPE == "application/problem+json"


def test_session_path_id_is_base64url_without_padding() -> None:
    """§5.1: {id} in session paths is the base64url encoding without padding [RFC4648] of the
    session identifier."""
    session = bytes.fromhex("fbff00112233445566778899aabbccdd")
    assert session_path_id(session) == "-_8AESIzRFVmd4iZqrvM3Q"
    assert parse_session_path_id("-_8AESIzRFVmd4iZqrvM3Q") == session
    for bad in ("-_8AESIzRFVmd4iZqrvM3Q==", "+/8AESIzRFVmd4iZqrvM3Q"):
        with pytest.raises(BadRequest):
            parse_session_path_id(bad)


def test_http2_or_http3_over_tls13_with_mutual_authentication_is_required() -> None:
    """§5.1: HTTP/2 or HTTP/3 over TLS 1.3 with mutual certificate authentication is REQUIRED."""
    pytest.skip("transport requirement: the sans-I/O protocol core opens no connection; the servers own it")


def test_instance_path_id_is_base64url_of_the_instance_name() -> None:
    """§5.1 Table 1 (PUT instances/{id}/status): the draft defines {id} only for sessions; ours
    is the base64url without padding of the UTF-8 instance name, the status's ``instance``
    (docs/interpretations.md), so a base URI is one path segment."""
    from sdcp_fast.protocol.messages import instance_path_id, parse_instance_path_id

    name = "https://drafter-a.example:8443/"
    text = instance_path_id(name)
    assert set(text) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
    assert parse_instance_path_id(text) == name
    with pytest.raises(BadRequest):
        parse_instance_path_id(text + "=")


def test_clients_read_problem_types_by_suffix_and_unlisted_statuses_by_class() -> None:
    """§5.1: errors use Problem Details; clients handle unlisted status codes by class. A client
    maps any type URI ending in a Table 2 suffix to that problem, and anything else by its
    status class (4xx: the request; 5xx: the server)."""
    from sdcp_fast.protocol.problems import StaleBase, UnlistedProblem, problem_from_response

    got = problem_from_response(409, {"type": "https://other.example/p/sdcp-stale-base",
                                      "session_state": {"round": 1}})
    assert isinstance(got, StaleBase) and got.extra == {"session_state": {"round": 1}}
    for status, server in ((429, False), (507, True)):
        unlisted = problem_from_response(status, None)
        assert isinstance(unlisted, UnlistedProblem) and unlisted.status == status
        assert unlisted.server_error is server and unlisted.suffix == f"http-{status // 100}xx"
