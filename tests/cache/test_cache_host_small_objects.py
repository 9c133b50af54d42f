"""Small objects in the host tier: what each one retains. A native buffer is a mapping of its
own, whole pages, so the soak's released q rows (~200 bytes, kept until LRU) grew the MLC by
~5.4 KiB each and puts failed with MemoryError at ~65,000 objects (``vm.max_map_count``)."""

from __future__ import annotations

import os

import pytest

from sdcp_fast import native
from sdcp_fast.cache import MLC, object_uri
from sdcp_fast.cache.tiers.host import SMALL_OBJECT, HostTier

SCOPE = bytes(16)
MAPS = "/proc/self/maps"
MAX_MAP_COUNT = "/proc/sys/vm/max_map_count"

needs_maps = pytest.mark.skipif(not os.path.exists(MAPS), reason="counts mappings in /proc/self/maps (Linux)")


def _mappings() -> int:
    with open(MAPS) as f:
        return sum(1 for _ in f)


@pytest.fixture
def native_host():
    if not native.available():
        pytest.skip(native.status())
    tier = HostTier(1 << 30)
    if tier.allocator != "native-mlock":
        pytest.skip(f"host buffers come from {tier.allocator}, not the C++ extension")
    yield tier
    tier.close()


@needs_maps
def test_small_objects_take_no_mapping_each(native_host):
    before = _mappings()
    rows = [os.urandom(200) for _ in range(2000)]
    handles = [native_host.write(f"k{i}", row) for i, row in enumerate(rows)]
    assert _mappings() - before < 20, "one mapping per small object"
    assert all(bytes(native_host.read(h)) == row for h, row in zip(handles, rows, strict=True))
    large = native_host.write("large", bytes(SMALL_OBJECT))
    assert native_host.read(large).nbytes == SMALL_OBJECT


def test_out_of_mappings_stores_pageable_instead_of_failing(native_host, monkeypatch):
    class Exhausted:
        def HostBuffer(self, n: int):  # noqa: N802 - the extension's name
            raise MemoryError("std::bad_alloc")

        host_copy = staticmethod(native_host._native.host_copy)

    monkeypatch.setattr(native_host, "_native", Exhausted())
    data = os.urandom(SMALL_OBJECT * 2)
    handle = native_host.write("k", data)
    assert bytes(native_host.read(handle)) == data


@needs_maps
@pytest.mark.skipif(not os.path.exists(MAX_MAP_COUNT), reason="reads vm.max_map_count")
def test_more_small_objects_than_mappings_fit(native_host):
    with open(MAX_MAP_COUNT) as f:
        limit = int(f.read())
    if limit > 100_000:
        pytest.skip(f"vm.max_map_count is {limit}: too many objects to put in a test")
    n = limit + 1000
    session = os.urandom(16)
    row = os.urandom(200)
    with MLC([native_host]) as mlc:
        for r in range(1, n + 1):
            mlc.put(object_uri(SCOPE, session, "q_rows", r), row)
        assert mlc.stats()["index"]["objects"] == n
        assert bytes(mlc.get(object_uri(SCOPE, session, "q_rows", n))) == row
