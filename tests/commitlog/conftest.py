from __future__ import annotations

import itertools
from contextlib import ExitStack, contextmanager

import pytest

from sdcp_fast.commitlog import open_commit_log
from sdcp_fast.commitlog.file import FileCommitLog
from tests.commitlog.mlc_etcd import running_etcd


@pytest.fixture(scope="session")
def etcd_endpoint():
    with running_etcd() as endpoint:
        yield endpoint


_prefixes = itertools.count()


@contextmanager
def _served_logs(directory, http2: bool):
    from sdcp_fast.cache import MLC
    from sdcp_fast.cache.tiers.host import HostTier
    from sdcp_fast.commitlog.directory import LogDirectory
    from tests.mlc_server.serverkit import serving

    logs = LogDirectory(str(directory / "served"))
    with MLC([HostTier(1 << 16)]) as mlc, serving(mlc, logs=logs, http2=http2) as base:
        yield base
    logs.close()


@pytest.fixture(params=["h2", "http1"])
def http_logs(request, tmp_path):
    """An ``sdcp-fast mlc`` server (HTTP/2, or the HTTP/1.1 one) serving a LogDirectory on
    loopback: its base URL (``.http1`` says which)."""
    with _served_logs(tmp_path, request.param == "h2") as base:
        yield base


@pytest.fixture(params=["file", "mlc", "http2", "http1", pytest.param("etcd", marks=pytest.mark.services)])
def log_factory(request, tmp_path):
    """A function returning a fresh handle on one log (call twice: two writers, one log)."""
    stack = ExitStack()
    if request.param == "file":
        path = str(tmp_path / "c.log")
        factory = lambda: FileCommitLog(path)  # noqa: E731
    elif request.param == "mlc":
        import sdcp_fast.cache as cache
        from sdcp_fast.store import embedded

        store = embedded(str(tmp_path), host_bytes=1 << 20, disk_bytes=1 << 20, max_open_logs=2)
        request.addfinalizer(store.close)
        ref = cache.object_uri(bytes(16), bytes(16), "commit_log")
        factory = lambda: store.logs.log(ref)  # noqa: E731
    elif request.param in ("http2", "http1"):
        base = stack.enter_context(_served_logs(tmp_path, request.param == "http2"))
        ref = f"{base}/logs/{bytes(16).hex()}/{next(_prefixes):022d}/commit_log"
        if base.http1:
            from sdcp_fast.commitlog.http import HttpCommitLog

            factory = lambda: HttpCommitLog(ref, http1=True)  # noqa: E731
        else:
            factory = lambda: open_commit_log(ref)  # noqa: E731
    else:
        host, port = request.getfixturevalue("etcd_endpoint")
        ref = f"etcd://{host}:{port}/sdcp-test/{next(_prefixes)}"
        factory = lambda: open_commit_log(ref)  # noqa: E731
    opened = []

    def make():
        log = factory()
        opened.append(log)
        return log

    yield make
    for log in opened:
        log.close()
    stack.close()
