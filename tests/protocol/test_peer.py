"""Peer identity from certificate URI SANs (sdcp_fast/protocol/peer.py, §5.1, §6.3)."""

from __future__ import annotations

import pytest

from sdcp_fast.protocol.peer import Peer, PeerRole, peer_from_uris, require_role, role_uri, same_instance
from sdcp_fast.protocol.problems import Forbidden

BASE = "https://drafter-a.example:8443/"


def test_peer_from_uris_reads_one_base_uri_and_one_role():
    peer = peer_from_uris([BASE, role_uri(PeerRole.DRAFTER)])
    assert peer == Peer(uri=BASE, role=PeerRole.DRAFTER) and peer.is_(PeerRole.DRAFTER)
    assert peer_from_uris(["inproc://router", "urn:sdcp:role:router"]).role is PeerRole.ROUTER
    # Two base URIs or two different roles name nothing; an unknown role grants nothing.
    assert peer_from_uris([BASE, "https://b/", role_uri(PeerRole.DRAFTER)]).uri is None
    assert peer_from_uris([BASE, role_uri(PeerRole.DRAFTER), role_uri(PeerRole.ROUTER)]).role is None
    assert peer_from_uris([BASE, "urn:sdcp:role:king"]) == Peer(uri=BASE, role=None)
    # The same role twice is still that role; other URIs are ignored.
    assert peer_from_uris([role_uri(PeerRole.MLC)] * 2 + ["mailto:x@y"]) == Peer(uri=None, role=PeerRole.MLC)


def test_same_instance_ignores_a_trailing_slash_only():
    assert same_instance("https://a/", "https://a") and not same_instance("https://a/", "https://b/")


def test_require_role_admits_only_the_named_roles():
    drafter = Peer(uri=BASE, role=PeerRole.DRAFTER)
    assert require_role(drafter, PeerRole.DRAFTER) is drafter
    assert require_role(drafter, PeerRole.ROUTER, PeerRole.DRAFTER) is drafter
    for peer, roles in ((drafter, (PeerRole.ROUTER,)), (Peer(uri=BASE, role=None), (PeerRole.DRAFTER,)),
                        (None, (PeerRole.ROUTER,)), (drafter, ())):
        with pytest.raises(Forbidden) as info:
            require_role(peer, *roles)
        assert info.value.status == 403 and info.value.suffix == "sdcp-forbidden"
