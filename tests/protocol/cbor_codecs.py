"""Which CBOR codecs a test can run on (sdcp_fast.protocol.cbor: Python, and native where built)."""

from __future__ import annotations

import os

import pytest

from sdcp_fast.protocol import cbor


def require_native_cbor() -> None:
    """Skip without the native codec, saying why; under SDCP_REQUIRE_NATIVE=1 (CI) fail instead."""
    if not cbor.available():
        if os.environ.get("SDCP_REQUIRE_NATIVE") == "1":
            pytest.fail(f"SDCP_REQUIRE_NATIVE=1: {cbor.status()}")
        pytest.skip(cbor.status())
