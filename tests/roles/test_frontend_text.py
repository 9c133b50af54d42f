"""Text for the front end: pieces of a growing token sequence come out whole and once."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from sdcp_fast.model.toy import EOS, encode
from sdcp_fast.roles.frontend_text import IncrementalDecoder, ToyWords


class Bytes:
    """A byte-level tokenizer: one token per UTF-8 byte."""

    def encode(self, text: str) -> list[int]:
        return list(text.encode())

    def decode(self, ids: Sequence[int]) -> str:
        return bytes(ids).decode("utf-8", errors="replace")

    def chat(self, messages: Sequence[Any]) -> str:
        return ""


@pytest.mark.parametrize("step", [1, 2, 3, 5])
def test_multibyte_characters_split_across_tokens_come_out_whole(step: int) -> None:
    text = "héllo € 𝄞 naïve"
    ids = Bytes().encode(text)
    decoder = IncrementalDecoder(Bytes())
    pieces = [decoder.push(ids[i:i + step]) for i in range(0, len(ids), step)] + [decoder.flush()]
    assert "".join(pieces) == text
    assert not any("\ufffd" in p for p in pieces)


def test_word_pieces_keep_their_spaces_and_skip_stop_tokens() -> None:
    ids = encode("the verifier commits .") + [EOS]
    decoder = IncrementalDecoder(ToyWords(), skip=(EOS,))
    pieces = [decoder.push([t]) for t in ids] + [decoder.flush()]
    assert "".join(pieces) == "the verifier commits."
