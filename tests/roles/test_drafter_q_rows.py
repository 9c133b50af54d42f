"""The q_rows object a drafter puts (roles/drafter_q_rows.py q_row_object): the rows'
binary32 octets in position order and nothing around them (§5.2)."""

from __future__ import annotations

import struct

import torch

from sdcp_fast.roles.drafter_q_rows import q_row_object


def test_host_rows_go_as_a_flat_view_of_their_float32_octets() -> None:
    rows = torch.rand(3, 5)
    out = q_row_object(rows)
    assert isinstance(out, memoryview) and out.nbytes == 3 * 5 * 4
    assert list(struct.unpack("<15f", out)) == rows.reshape(-1).tolist()


def test_rows_of_another_dtype_or_layout_are_made_float32_and_contiguous() -> None:
    rows = torch.rand(5, 3, dtype=torch.float64).t()  # [3, 5], not contiguous
    out = q_row_object(rows)
    assert list(struct.unpack("<15f", out)) == rows.to(torch.float32).reshape(-1).tolist()
