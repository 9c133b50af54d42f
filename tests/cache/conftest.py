from __future__ import annotations

import pytest

from sdcp_fast.cache import MLC
from sdcp_fast.cache.tiers.disk import DiskTier
from sdcp_fast.cache.tiers.host import HostTier


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def small_mlc(tmp_path, clock):
    """Host tier of 4 KiB over a disk tier of 8 KiB: a few objects of 1-2 KiB fill it."""
    mlc = MLC([HostTier(4096), DiskTier(8192, str(tmp_path))], clock=clock)
    yield mlc
    mlc.close()
