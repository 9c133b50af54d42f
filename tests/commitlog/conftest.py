from __future__ import annotations

import itertools

import pytest
from mlc_etcd import running_etcd

from sdcp_fast.commitlog import open_commit_log
from sdcp_fast.commitlog.file import FileCommitLog


@pytest.fixture(scope="session")
def etcd_endpoint():
    with running_etcd() as endpoint:
        yield endpoint


_prefixes = itertools.count()


@pytest.fixture
def http_logs(tmp_path):
    """An ``sdcp-fast mlc`` app serving a LogDirectory on loopback: its base URL."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent.parent / "cache"))
    from mlc_server import serving

    from sdcp_fast.cache import MLC
    from sdcp_fast.cache.tiers.host import HostTier
    from sdcp_fast.commitlog.directory import LogDirectory

    logs = LogDirectory(str(tmp_path / "served"))
    with MLC([HostTier(1 << 16)]) as mlc, serving(mlc, logs=logs) as base:
        yield base
    logs.close()


@pytest.fixture(params=["file", "mlc", "http", pytest.param("etcd", marks=pytest.mark.services)])
def log_factory(request, tmp_path):
    """A function returning a fresh handle on one log (call twice: two writers, one log)."""
    if request.param == "file":
        path = str(tmp_path / "c.log")
        factory = lambda: FileCommitLog(path)  # noqa: E731
    elif request.param == "mlc":
        import sdcp_fast.cache as cache
        from sdcp_fast.embedded import embedded

        mlc = embedded(str(tmp_path), host_bytes=1 << 20, disk_bytes=1 << 20, max_open_logs=2)
        request.addfinalizer(mlc.close)
        ref = cache.object_uri(bytes(16), bytes(16), "commit_log")
        factory = lambda: open_commit_log(ref, mlc=mlc)  # noqa: E731
    elif request.param == "http":
        base = request.getfixturevalue("http_logs")
        ref = f"{base}/logs/{bytes(16).hex()}/{next(_prefixes):022d}/commit_log"
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
