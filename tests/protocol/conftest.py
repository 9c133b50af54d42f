"""The CBOR tests run on both codecs of sdcp_fast.protocol.cbor, Python and native, as the
same tests: a test module asks for them with ``pytestmark = pytest.mark.usefixtures("cbor_codec")``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sdcp_fast.protocol import cbor
from tests.protocol.cbor_codecs import require_native_cbor


# Module scope: the property tests (hypothesis) refuse function-scoped fixtures.
@pytest.fixture(scope="module", params=[cbor.PY, cbor.C])
def cbor_codec(request: pytest.FixtureRequest) -> Iterator[str]:
    name: str = request.param
    if name == cbor.C:
        require_native_cbor()
    cbor.use(name)
    try:
        yield name
    finally:
        cbor.use(None)
