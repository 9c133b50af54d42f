"""One deployment of real processes for every fault scenario (starting one costs ~20 s on two
cores); each scenario leaves it whole: dead processes restarted, stopped ones continued."""

from __future__ import annotations

import os
import shutil

import pytest

from .faultkit import FaultUp

STATUS_TTL_MS = 1500


@pytest.fixture(scope="session")
def seed() -> int:
    """Every scenario's draws (requests, fault times, proxy faults) come from it."""
    return int(os.environ.get("SDCP_FAULT_SEED", "1"))


@pytest.fixture(scope="session")
def up(tmp_path_factory: pytest.TempPathFactory, seed: int):
    if shutil.which("curl") is None:
        pytest.skip("curl is not installed (the kit reads metrics with it)")
    deployment = FaultUp(tmp_path_factory.mktemp("faults"), model="toy", drafters=("toy-good", "toy-good"),
                         status_ttl_ms=STATUS_TTL_MS, seed=seed)
    try:
        deployment.start(timeout=120)
        yield deployment
    finally:
        deployment.stop()


@pytest.fixture
def whole(up: FaultUp):
    """The deployment, made whole again after the test."""
    yield up
    up.faults()
    for svc in up.services.values():
        if svc.process is not None and svc.process.poll() is None:
            os.kill(svc.process.pid, 18)  # SIGCONT: a no-op unless the test stopped it
    up.restart()
    up.wait_serving()
