"""The native page-locked buffer and its copy, against plain Python as the reference."""

from __future__ import annotations

import os
import resource

import pytest

from sdcp_fast import native


@pytest.fixture
def C():
    if not native.available():
        pytest.skip(native.status())
    return native.module()


@pytest.mark.parametrize("size", [0, 1, 4095, 4096, 4097, 1 << 20, (9 << 20) + 3])
def test_host_copy_matches_slice_assignment(C, size):
    src = bytes((i * 7) % 251 for i in range(min(size, 1 << 16))) * (size // (1 << 16) + 1)
    src = src[:size]
    buf = C.HostBuffer(size + 8)
    C.host_copy(buf, src, 8)
    ref = bytearray(size + 8)
    ref[8:] = src
    assert bytes(memoryview(buf)) == bytes(ref)
    assert buf.size == len(buf) == size + 8


def test_buffer_is_writable_and_outlives_its_name(C):
    buf = C.HostBuffer(16)
    view = memoryview(buf)
    del buf
    view[:4] = b"abcd"
    assert bytes(view[:4]) == b"abcd" and not view.readonly


def test_copy_refuses_overflow_and_strided_sources(C):
    buf = C.HostBuffer(4)
    with pytest.raises(IndexError):
        C.host_copy(buf, b"12345")
    with pytest.raises(IndexError):
        C.host_copy(buf, b"12", 3)
    np = pytest.importorskip("numpy")
    with pytest.raises(ValueError):
        C.host_copy(C.HostBuffer(64), np.zeros((4, 4), np.uint8)[:, ::2])


def _locked_kib() -> int:
    with open("/proc/self/status") as f:
        return int(next(line for line in f if line.startswith("VmLck:")).split()[1])


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads VmLck from /proc/self/status")
def test_locked_reports_mlock_outcome(C):
    size = 1 << 20
    before = _locked_kib()
    buf = C.HostBuffer(size)
    if buf.locked:
        assert _locked_kib() - before >= size // 1024, "locked says True: the pages are mlocked"
    else:
        soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
        assert os.geteuid() != 0 and soft != resource.RLIM_INFINITY and soft < before * 1024 + size, \
            "locked says False although mlock could succeed"
        assert _locked_kib() == before
    del buf
    assert _locked_kib() == before, "freeing the buffer unlocks its pages"
