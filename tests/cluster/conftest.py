"""Simulated hosts for the cluster tests: each test run's own subnet of 198.18.0.0/15 and
interface tag, removed however the test ends. Where network namespaces cannot be made the
tests skip, saying why; under CI=true they fail with that one line instead."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from sdcp_fast.cluster import simulate
from sdcp_fast.cluster.netns import free_subnet, unavailable
from sdcp_fast.cluster.spec import ClusterSpec, default_layout


def require_namespaces() -> None:
    why = unavailable()
    if why is None:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"the cluster tests need network namespaces: {why}", pytrace=False)
    pytest.skip(why)


def require_etcd() -> None:
    if shutil.which("etcd") is None:
        pytest.skip("etcd binary missing: scripts/services.sh installs Debian's etcd-server")


def layout(n: int = 3, **kwargs: object) -> ClusterSpec:
    """The default layout on a subnet no interface here uses yet, with 3 s leases."""
    from dataclasses import replace

    return replace(default_layout(n, subnet=free_subnet(), **kwargs), lease_ttl_s=3)  # type: ignore[arg-type]


@pytest.fixture
def cluster_dir(tmp_path: Path) -> Iterator[Path]:
    """A folder for ``simulate.up``; whatever was started in it is removed afterwards."""
    require_namespaces()
    require_etcd()
    yield tmp_path
    simulate.down(tmp_path)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, ClusterSpec]]:
    """Three simulated hosts of the default layout with the toy model, shared by one test module's
    tests in their order and removed after its last."""
    require_namespaces()
    require_etcd()
    directory = tmp_path_factory.mktemp("cluster")
    spec = layout(3, model="toy")
    try:
        simulate.up(directory, spec, timeout=150)
        yield directory, spec
    finally:
        assert simulate.down(directory) == []
