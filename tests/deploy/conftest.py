"""The model fixtures (a small random Llama) serve the in-process deployment's decoding tests too."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sdcp_fast.deploy.up import Up
from tests.model.conftest import small_model  # noqa: F401


@contextmanager
def toy_up(directory: Path, *, timeout: float = 120, **settings: Any) -> Iterator[Up]:
    """``sdcp-fast up`` in ``directory`` with the toy model and 1.5 s statuses (a killed
    instance expires quickly), stopped however the block ends."""
    deployment = Up(directory, model="toy", status_ttl_ms=1500, **settings)
    try:
        deployment.start(timeout=timeout)
        yield deployment
    finally:
        deployment.stop()
