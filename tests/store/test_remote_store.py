"""The store of an ``sdcp-fast mlc`` server (sdcp_fast/store/remote_store.py): its commit logs are
the server's, and no answer at all is a ConnectionError (the roles retry it)."""

from __future__ import annotations

import asyncio

import pytest

from sdcp_fast.cache import object_uri
from sdcp_fast.protocol.commitlog import FenceRecord
from sdcp_fast.store import RemoteStore, embedded
from sdcp_fast.transport import http_transport
from tests.mlc_server.serverkit import serving

LOG = object_uri(bytes(16), bytes(16), "commit_log")


def test_mlc_logs_are_the_servers_and_an_http_reference_shares_the_transport(tmp_path):
    with embedded(str(tmp_path)) as served, serving(served.mlc, logs=served.logs, http2=True) as base:
        async def scenario():
            transport = http_transport(None)
            store = RemoteStore(base, transport)
            try:
                await (await store.commit_log(LOG)).append(FenceRecord(1), '"0"')
                by_url = await store.commit_log(f"{base}/logs/{LOG.removeprefix('mlc://')}")
                return (await by_url.read()).records, by_url.transport is transport  # type: ignore[attr-defined]
            finally:
                await store.aclose()

        assert asyncio.run(scenario()) == ([FenceRecord(1)], True)
        assert served.logs.log(LOG).read().records == [FenceRecord(1)]


def test_no_answer_is_a_connection_error():
    from sdcp_fast.deploy.up import free_port

    async def scenario():
        store = RemoteStore(f"http://127.0.0.1:{free_port()}")
        try:
            with pytest.raises(ConnectionError):
                await store.get(object_uri(bytes(16), bytes(16), "q_rows", 1))
            with pytest.raises(ConnectionError):
                await (await store.commit_log(LOG)).read()
        finally:
            await store.aclose()

    asyncio.run(scenario())
