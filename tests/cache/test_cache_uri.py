from __future__ import annotations

import pytest

from sdcp_fast.cache import policy
from sdcp_fast.cache.uri import (
    ObjectName,
    at_node,
    local_name,
    node_authority,
    node_base,
    node_of,
    object_uri,
    parse,
    scope_of,
    served_name,
    tagged_for_another,
    writer_tag,
)
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


# Names that name their node (docs/interpretations.md, "MLC nodes in object names").
NODE_B = "https://198.18.0.13:8470"


def test_a_name_at_a_node_carries_the_node_s_authority_before_the_plain_name():
    plain = object_uri(SCOPE, bytes(range(16)), "q_rows", 7, tag="d-1a2b")
    uri = at_node(plain, NODE_B + "/")
    assert uri == "mlc://198.18.0.13:8470/00112233445566778899aabbccddeeff/AAECAwQFBgcICQoLDA0ODw/q_rows/7.d-1a2b"
    assert node_of(uri) == "198.18.0.13:8470" and node_base(node_of(uri)) == NODE_B
    assert local_name(uri) == plain and at_node(uri, "10.0.0.1:1") == uri  # named once, by its writer
    # The object is the same one wherever it is: tag, scope and kind read through the node.
    assert parse(uri) == parse(plain) and scope_of(uri) == scope_of(plain) == SCOPE.hex()
    assert tagged_for_another(uri, "https://drafter-b.test/") and not tagged_for_another(
        at_node(object_uri(SCOPE, bytes(16), "q_rows", 1, tag=writer_tag("https://d.test/")), NODE_B), "https://d.test/")


def test_a_plain_name_names_no_node_and_is_unchanged():
    plain = object_uri(SCOPE, bytes(range(16)), "committed_tokens", 2)
    assert node_of(plain) is None and local_name(plain) == plain and served_name(plain) == parse(plain)


def test_a_node_keeps_only_plain_names():
    with pytest.raises(ValueError, match="plain names"):
        served_name(at_node(object_uri(SCOPE, bytes(16), "q_rows", 1), NODE_B))


@pytest.mark.parametrize("given,canonical", [
    ("https://198.18.0.11:8470", "198.18.0.11:8470"),
    ("https://198.18.0.11:8470/", "198.18.0.11:8470"),
    ("198.18.0.11:8470", "198.18.0.11:8470"),
    ("https://MLC-H1.Example:8470", "mlc-h1.example:8470"),
    ("https://[0:0::1]:8470", "[::1]:8470"),
])
def test_node_authority_is_canonical(given, canonical):
    assert node_authority(given) == canonical


@pytest.mark.parametrize("bad", [
    "http://198.18.0.11:8470",  # nodes are reached over TLS only
    "https://198.18.0.11",  # the port is always given: a node never reads as a scope
    "https://198.18.0.11:0", "https://198.18.0.11:70000", "https://u@198.18.0.11:8470",
    "https://198.18.0.11:8470/objects", "https://bad_host:8470", "00112233445566778899aabbccddeeff:1",
])
def test_node_authority_refuses(bad):
    with pytest.raises(ValueError):
        node_authority(bad)


@pytest.mark.parametrize("bad", [
    "mlc://198.18.0.11:8470",  # a node without a name
    "mlc://198.18.0.11:8470/00112233445566778899aabbccddeeff/s/q_rows/1/extra",
    "mlc://198.18.0.011:8470/00112233445566778899aabbccddeeff/s/q_rows/1",  # not canonical
    "mlc://MLC.example:8470/00112233445566778899aabbccddeeff/s/q_rows/1",
    "mlc://198.18.0.11:8470/198.18.0.12:8470/00112233445566778899aabbccddeeff/s/q_rows/1",
])
def test_a_name_at_a_node_that_is_not_well_formed_is_refused(bad):
    with pytest.raises(ValueError):
        parse(bad)
