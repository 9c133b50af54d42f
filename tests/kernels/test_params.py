"""The checks of a verification batch's ragged layout (sdcp_fast/kernels/params.py)."""

from __future__ import annotations

import pytest
import torch

from sdcp_fast.kernels.params import ragged

V = 10


def _check(cu: list[int], tokens: list[int]):  # type: ignore[no-untyped-def]
    logits = torch.zeros(len(tokens) + len(cu) - 1, V)
    return ragged(logits, torch.tensor(tokens, dtype=torch.int64), torch.tensor(cu))


def test_a_valid_layout_gives_its_longest_draft() -> None:
    assert _check([0, 2, 2, 5], [1, 2, 3, 4, 9]).m_max == 3
    assert _check([0, 0], []).m_max == 0


@pytest.mark.parametrize(("cu", "tokens", "why"), [
    ([1, 3], [1, 2], "start at 0"),
    ([0, 3, 2, 3], [1, 2, 3], "non-decreasing"),
    ([0, 2], [1, 2, 3], "end at len"),
    ([0, 2], [1, -1], r"token ids in \[0, 10\)"),
    ([0, 2], [1, V], r"token ids in \[0, 10\)"),
])
def test_an_invalid_layout_is_refused(cu: list[int], tokens: list[int], why: str) -> None:
    with pytest.raises(ValueError, match=why):
        _check(cu, tokens)
