"""Every check quotes its sentence of the draft, verbatim up to runs of white space."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from sdcp_fast.conform.statements import CHECKS

DRAFT = Path(os.environ.get("SDCP_DRAFT", "/work/shared/spec/sdcp-draft.txt"))


def _words(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


@pytest.mark.skipif(not DRAFT.is_file(), reason=f"the draft's text is not at {DRAFT} (set SDCP_DRAFT)")
def test_every_quote_is_the_drafts_text() -> None:
    draft = _words(DRAFT.read_text())
    missing = [c.id for c in CHECKS.values() if _words(c.quote) not in draft]
    assert not missing


def test_every_check_has_a_section_a_statement_and_a_quote() -> None:
    for c in CHECKS.values():
        assert re.fullmatch(r"[4-6](\.\d+)*(/[4-6](\.\d+)*)*", c.section), c
        assert c.statement and len(c.quote) > 20, c
