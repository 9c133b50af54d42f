"""Membership records as etcd keys and values (pure)."""

from __future__ import annotations

import pytest

from sdcp_fast.cluster.membership import Member, cert_digest, decode, encode, key, prefix, range_end

M = Member("verifier", "verifier-h2", "h2", "https://198.18.0.12:8600/", "ab" * 32)


def test_a_record_is_keyed_by_cluster_role_and_name_and_reads_back() -> None:
    assert key("c1", M) == "/sdcp/c1/instances/verifier/verifier-h2"
    assert key("c1", M).startswith(prefix("c1", "verifier")) and key("c1", M).startswith(prefix("c1"))
    assert decode(encode(M)) == M


def test_the_range_end_covers_the_prefix_and_nothing_after_it() -> None:
    start = prefix("c1", "verifier")
    end = range_end(start)
    assert start < key("c1", M) < end
    assert not start < prefix("c1", "verifierz") < end  # another role's keys are outside
    assert range_end("/a/") == "/a0"


@pytest.mark.parametrize("value", [b"", b"[]", b'{"role": "verifier"}', b"\xff"])
def test_what_is_not_a_record_is_refused(value: bytes) -> None:
    with pytest.raises(ValueError, match="not a membership record"):
        decode(value)


@pytest.mark.parametrize("bad", ["", "a/b"])
def test_names_cannot_escape_their_key_segment(bad: str) -> None:
    with pytest.raises(ValueError, match="key segment"):
        prefix(bad)
    with pytest.raises(ValueError, match="key segment"):
        key("c1", Member("drafter", bad, "h1", "https://x/", ""))


def test_the_digest_is_the_certificate_s_der_sha256(tmp_path) -> None:
    import hashlib
    import ssl

    from sdcp_fast.protocol.peer import PeerRole
    from sdcp_fast.transport.certs import InstanceSpec, write_certificates

    written = write_certificates(tmp_path, [InstanceSpec("v", PeerRole.VERIFIER, "https://198.18.0.12:8600/")])
    pem = written["v"][0].read_bytes()
    assert cert_digest(pem) == hashlib.sha256(ssl.PEM_cert_to_DER_cert(pem.decode())).hexdigest()
    assert len(cert_digest(pem)) == 64
