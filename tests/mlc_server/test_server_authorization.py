"""Who may touch what over mTLS (docs/security.md, "MLC"): identities and
roles come from the client certificates' URI SANs."""

from __future__ import annotations

import pytest

from sdcp_fast.cache import MLC, ObjectLeased, UnknownLease, object_uri
from sdcp_fast.cache.http_client import RemoteMLC
from sdcp_fast.cache.tiers.host import HostTier
from sdcp_fast.commitlog.directory import LogDirectory
from sdcp_fast.commitlog.http import HttpCommitLog
from sdcp_fast.protocol.commitlog import CommitRecord, FenceRecord
from sdcp_fast.protocol.problems import Forbidden
from sdcp_fast.transport.tls import client_context, server_context
from tests.store.certkit import make_certs

from .serverkit import ALPN, WIRES, serving

SCOPE = bytes(range(16))
Q = object_uri(SCOPE, b"s" * 16, "q_rows", 1)
TOKENS = object_uri(SCOPE, b"s" * 16, "committed_tokens")
LOG = object_uri(SCOPE, b"s" * 16, "commit_log")


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return make_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture(params=WIRES)
def site(request, certs, tmp_path):
    logs = LogDirectory(str(tmp_path / "logs"), sync=False)
    ctx = server_context(certs["server_cert"], certs["server_key"], certs["ca"], alpn=(ALPN[request.param],))
    with MLC([HostTier(1 << 20)]) as mlc, serving(mlc, ctx, logs=logs, http2=request.param == "h2") as base:
        clients: dict[str, RemoteMLC] = {}

        def as_(who: str) -> RemoteMLC:
            if who not in clients:
                clients[who] = base.client(ssl=client_context(certs[f"{who}_cert"], certs[f"{who}_key"], certs["ca"]))
            return clients[who]

        def log_as(who: str) -> HttpCommitLog:
            return base.log(LOG, ssl=client_context(certs[f"{who}_cert"], certs[f"{who}_key"], certs["ca"]))

        yield as_, log_as, mlc
        for c in clients.values():
            c.close()
    logs.close()


def forbidden(fn, *args, **kwargs) -> None:
    with pytest.raises(Forbidden) as exc:
        fn(*args, **kwargs)
    assert exc.value.status == 403 and exc.value.suffix == "sdcp-forbidden"


def test_only_the_writer_or_a_router_may_overwrite_lease_away_or_delete(site):
    as_, _, mlc = site
    owner, other = as_("client"), as_("drafter2")
    stored = owner.put(Q, b"rows", lease_ttl=30)
    assert mlc.head(Q).owner == "https://drafter-a.test:8443/"
    forbidden(other.put, Q, b"mine now")
    forbidden(other.lease, Q, 3600)
    forbidden(other.delete, Q)
    forbidden(other.release, stored.lease)  # even knowing the lease id
    forbidden(other.renew, stored.lease, 30)
    owner.renew(stored.lease, 30)
    owner.release(stored.lease)
    owner.put(Q, b"rows v2")
    forbidden(other.delete, Q)
    as_("router").delete(Q)
    assert not mlc.contains(Q)


def test_roles_write_their_own_kinds(site):
    as_, _, _ = site
    forbidden(as_("verifier").put, Q, b"q rows are draft state")
    forbidden(as_("client").put, TOKENS, b"committed tokens are the verifier's")
    forbidden(as_("norole").put, Q, b"no role")
    forbidden(as_("reader").put, TOKENS, b"clients only read")
    as_("verifier").put(TOKENS, b"\x01\x02")
    assert bytes(as_("reader").get(TOKENS)) == b"\x01\x02", "a client reads the output"
    assert bytes(as_("client").get(TOKENS)) == b"\x01\x02", "a drafter learns committed tokens"


def test_verifiers_read_and_hold_q_rows_others_may_not(site):
    as_, _, _ = site
    as_("client").put(Q, b"rows")
    verifier = as_("verifier")
    assert bytes(verifier.get(Q)) == b"rows"
    lease = verifier.lease(Q, 10)
    with pytest.raises(ObjectLeased):
        as_("client").delete(Q)
    forbidden(as_("client").release, lease)  # the writer may not drop the verifier's hold
    verifier.release(lease)
    forbidden(as_("reader").get, Q)
    forbidden(as_("norole").get, Q)
    forbidden(as_("norole").head, Q)
    forbidden(verifier.delete, Q)


def test_lease_ids_are_unguessable_and_ttls_bounded(site):
    as_, _, _ = site
    as_("client").put(Q, b"rows")
    lease = as_("verifier").lease(Q, 10)
    assert len(lease) == 32 and int(lease, 16) >= 0
    with pytest.raises(UnknownLease):
        as_("router").release(lease[:-1] + ("0" if lease[-1] != "0" else "1"))
    from sdcp_fast.protocol.problems import BadRequest

    with pytest.raises(BadRequest):
        as_("verifier").lease(Q, 2.0 ** 64 / 1000)


def test_commit_logs_verifiers_append_routers_fence(site):
    _, log_as, _ = site
    rec = CommitRecord(1, 1, (5,), 1, bytes(32))
    forbidden(log_as("client").append, rec, '"0"')
    forbidden(log_as("router").append, rec, '"0"')
    forbidden(log_as("verifier").append, FenceRecord(2), None)
    assert log_as("verifier").append(rec, '"0"') == '"1"'
    assert log_as("router").append(FenceRecord(2), None) == '"2"'
    assert log_as("verifier").read().records == [rec, FenceRecord(2)]
    forbidden(log_as("norole").read)
    forbidden(log_as("client").read)


def test_stats_are_for_operators(site):
    as_, _, _ = site
    assert "tiers" in as_("router").stats()
    forbidden(as_("client").stats)
    forbidden(as_("norole").stats)


def test_a_batch_append_is_authorized_entry_by_entry(site):
    """POST /logs: who may append at all is checked before the body; then each entry on its
    own, as its single append would be (verifiers commit, routers fence)."""
    from sdcp_fast.commitlog.http import append_batch

    _, log_as, _ = site
    rec = CommitRecord(1, 1, (5,), 1, bytes(32))

    def batch(who: str, entries):
        log = log_as(who)
        try:
            return log._run(append_batch([(log.aio, record, tag) for record, tag in entries]))
        finally:
            log.close()

    by_verifier = batch("verifier", [(FenceRecord(2), None), (rec, '"0"')])
    assert isinstance(by_verifier[0], Forbidden) and by_verifier[1] == '"1"'
    by_router = batch("router", [(CommitRecord(1, 2, (6,), 2, bytes(32)), '"1"'), (FenceRecord(2), None)])
    assert isinstance(by_router[0], Forbidden) and by_router[1] == '"2"'
    for who in ("client", "reader", "norole"):
        assert all(isinstance(r, Forbidden) and r.status == 403 for r in batch(who, [(rec, '"2"')]))
    assert log_as("verifier").read().records == [rec, FenceRecord(2)]
