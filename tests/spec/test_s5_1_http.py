"""Conformance: §5.1 HTTP Usage."""

from __future__ import annotations

import json
import ssl
from pathlib import Path

import pytest

from sdcp_fast.protocol.messages import MEDIA_TYPE, parse_session_path_id, session_path_id
from sdcp_fast.protocol.problems import BY_SUFFIX, PROBLEM_MEDIA_TYPE, BadRequest
from sdcp_fast.transport.base import Request, Response


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


def test_http2_or_http3_over_tls13_with_mutual_authentication_is_required(tmp_path: Path) -> None:
    """§5.1: HTTP/2 or HTTP/3 over TLS 1.3 with mutual certificate authentication is REQUIRED.
    A role's server (transport/h2server.py with transport/tls.py's context) serves a client
    with a certificate over h2 and TLS 1.3; a client that offers at most TLS 1.2, and one
    without a certificate, never reach a handler."""
    from sdcp_fast.protocol.peer import PeerRole
    from sdcp_fast.transport import loop
    from sdcp_fast.transport.certs import InstanceSpec, write_certificates
    from sdcp_fast.transport.errors import TransportError
    from sdcp_fast.transport.h2client import H2Transport
    from sdcp_fast.transport.h2server import serve
    from sdcp_fast.transport.tls import client_context, server_context

    paths = write_certificates(tmp_path, [InstanceSpec("verifier", PeerRole.VERIFIER, "https://127.0.0.1/"),
                                          InstanceSpec("drafter", PeerRole.DRAFTER, "https://127.0.0.1:1/")])
    ca = str(tmp_path / "ca.pem")
    cert, key = (str(p) for p in paths["drafter"])
    tls12 = client_context(cert, key, ca)
    tls12.minimum_version = tls12.maximum_version = ssl.TLSVersion.TLSv1_2
    anonymous = ssl.create_default_context(cafile=ca)
    anonymous.set_alpn_protocols(["h2"])
    served: list[Request] = []

    async def handler(request: Request) -> Response:
        served.append(request)
        return Response(204)

    async def scenario() -> tuple[str | None, str | None, int]:
        server_ctx = server_context(*(str(p) for p in paths["verifier"]), ca)
        async with await serve(handler, "127.0.0.1", 0, ssl=server_ctx) as server:
            base = f"https://127.0.0.1:{server.port}/"
            async with H2Transport(client_context(cert, key, ca)) as client:
                assert (await client.request(base, "GET", "x")).status == 204
                (connection,) = client._connections.values()
                tls = connection.transport.get_extra_info("ssl_object")  # type: ignore[union-attr]
                negotiated = tls.selected_alpn_protocol(), tls.version()
            for refused in (tls12, anonymous):
                async with H2Transport(refused) as client:
                    with pytest.raises(TransportError):
                        await client.request(base, "GET", "x", timeout=5)
            return (*negotiated, len(served))

    assert loop.run(scenario()) == ("h2", "TLSv1.3", 1)


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
