from __future__ import annotations

import pytest

from sdcp_fast.cache import policy
from sdcp_fast.cache.uri import ObjectName, object_uri, parse, scope_of, tagged_for_another, writer_tag
from sdcp_fast.protocol.peer import Peer, PeerRole

SCOPE = bytes.fromhex("00112233445566778899aabbccddeeff")


def test_object_uri_round_trips():
    uri = object_uri(SCOPE, bytes(range(16)), "q_rows", 7)
    assert uri == "mlc://00112233445566778899aabbccddeeff/AAECAwQFBgcICQoLDA0ODw/q_rows/7"
    assert parse(uri) == ObjectName(SCOPE, "AAECAwQFBgcICQoLDA0ODw", "q_rows", 7)
    assert str(parse(uri)) == uri


def test_a_round_may_carry_its_writers_tag():
    uri = object_uri(SCOPE, bytes(range(16)), "q_rows", 7, tag="d-1a2b")
    assert uri.endswith("/q_rows/7.d-1a2b")
    assert parse(uri) == ObjectName(SCOPE, "AAECAwQFBgcICQoLDA0ODw", "q_rows", 7, "d-1a2b")
    assert str(parse(uri)) == uri and uri != object_uri(SCOPE, bytes(range(16)), "q_rows", 7)


@pytest.mark.parametrize("tag", ["", "a.b", "a/b", "x" * 33, "é"])
def test_a_bad_tag_is_refused(tag):
    with pytest.raises(ValueError):
        object_uri(SCOPE, b"s" * 16, "q_rows", 1, tag=tag)
    with pytest.raises(ValueError):
        parse(f"mlc://{SCOPE.hex()}/s/q_rows/1.{tag}")


def test_a_tag_needs_a_round():
    with pytest.raises(ValueError):
        object_uri(SCOPE, b"s" * 16, "prompt_kv", tag="d")


def test_per_session_objects_have_no_round():
    uri = object_uri(SCOPE, "sess", "commit_log")
    assert parse(uri).round is None and uri.endswith("/sess/commit_log")


@pytest.mark.parametrize("bad", [
    "http://x/y", "mlc://00/s/q_rows/1", "mlc://" + "0" * 32 + "/s", "mlc://" + "0" * 32 + "/s/k/x",
    "mlc://" + "0" * 32 + "/s p/k/1", "mlc://" + "0" * 32 + "/s/k/1/extra",
])
def test_parse_rejects(bad):
    with pytest.raises(ValueError):
        parse(bad)


def test_object_uri_rejects_bad_parts():
    with pytest.raises(ValueError):
        object_uri(b"short", b"s", "q_rows", 1)
    with pytest.raises(ValueError):
        object_uri(SCOPE, b"s", "weights", 1)


def test_scope_of_is_the_accounting_key():
    assert scope_of(object_uri(SCOPE, b"s" * 16, "draft_kv", 1)) == SCOPE.hex()
    assert scope_of("anything-else") == "-"


def test_a_session_id_of_another_size_is_refused():
    with pytest.raises(ValueError):
        object_uri(SCOPE, b"short", "q_rows", 1)


@pytest.mark.parametrize(("configured", "certified"), [("https://v1.example:8443/", "https://v1.example:8443"),
                                                        ("https://v1.example:8443", "https://v1.example:8443/")])
def test_writer_tag_ignores_a_trailing_slash(configured, certified):
    """A router names a verifier's objects from its configured URI, the MLC checks them against
    its certificate's: spelled with and without the slash, the writer is the same one."""
    assert writer_tag(configured) == writer_tag(certified)
    assert writer_tag("https://v1.example:8443/") != writer_tag("https://v2.example:8443/")
    uri = object_uri(SCOPE, b"s" * 16, "committed_tokens", 1, tag=writer_tag(configured))
    assert not tagged_for_another(uri, certified)
    # The MLC lets the verifier write the name made for it, whichever spelling its certificate has.
    policy.may_put(Peer(certified, PeerRole.VERIFIER), parse(uri))
