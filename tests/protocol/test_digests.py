"""Committed-prefix digest chain (§4.2)."""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sdcp_fast.protocol.digests import PREFIX_DOMAIN, extend_digest, prefix_digest, uint32_be
from sdcp_fast.protocol.problems import BadRequest

CD = bytes(range(32))
tokens = st.lists(st.integers(0, 0xFFFFFFFF), max_size=20)


def test_d0_by_hand() -> None:
    prompt = [1, 0xFFFFFFFF, 65536]
    expected = hashlib.sha256(
        b"SDCP-PREFIX-1\x00" + CD + b"\x00\x00\x00\x03" + b"\x00\x00\x00\x01\xff\xff\xff\xff\x00\x01\x00\x00"
    ).digest()
    assert prefix_digest(CD, prompt) == expected
    assert PREFIX_DOMAIN == b"SDCP-PREFIX-1\x00"


def test_empty_prompt() -> None:
    assert prefix_digest(CD, []) == hashlib.sha256(b"SDCP-PREFIX-1\x00" + CD + bytes(4)).digest()


def test_dk_by_hand() -> None:
    d0 = prefix_digest(CD, [7])
    d1 = hashlib.sha256(d0 + struct.pack(">I", 42)).digest()
    d2 = hashlib.sha256(d1 + struct.pack(">I", 0)).digest()
    assert extend_digest(d0, [42, 0]) == d2
    assert extend_digest(d0, []) == d0


@given(tokens, tokens, tokens)
def test_chain_composes(prompt: list[int], a: list[int], b: list[int]) -> None:
    d0 = prefix_digest(CD, prompt)
    assert extend_digest(extend_digest(d0, a), b) == extend_digest(d0, a + b)


@given(tokens, tokens)
def test_different_prefixes_give_different_digests(a: list[int], b: list[int]) -> None:
    if a != b:
        assert prefix_digest(CD, a) != prefix_digest(CD, b)
        assert extend_digest(CD, a) != extend_digest(CD, b) or len(a) != len(b) or a == b


def test_prompt_and_output_are_not_interchangeable() -> None:
    # d[0] binds P, so moving a token from the prompt into the output changes the digest.
    assert extend_digest(prefix_digest(CD, [1]), [2]) != prefix_digest(CD, [1, 2])


@pytest.mark.parametrize("bad", [-1, 1 << 32, 2.0, "1", True])
def test_token_outside_uint32_is_bad_request(bad: object) -> None:
    with pytest.raises(BadRequest):
        prefix_digest(CD, [1, bad])  # type: ignore[list-item]
    with pytest.raises(BadRequest):
        extend_digest(CD, [1, bad])  # type: ignore[list-item]


def test_digest_inputs_must_be_32_bytes() -> None:
    with pytest.raises(BadRequest):
        prefix_digest(CD[:31], [])
    with pytest.raises(BadRequest):
        extend_digest(CD + b"\x00", [])
    with pytest.raises(BadRequest):
        extend_digest(bytearray(CD), [])  # type: ignore[arg-type]


class HugeSequence(Sequence[int]):
    def __len__(self) -> int:
        return 1 << 32

    def __getitem__(self, index: object) -> int:  # type: ignore[override]
        raise AssertionError("the length check comes first")


def test_prompt_length_must_fit_uint32() -> None:
    with pytest.raises(BadRequest, match="length"):
        prefix_digest(CD, HugeSequence())


def test_uint32_be() -> None:
    assert uint32_be([1, 258]) == b"\x00\x00\x00\x01\x00\x00\x01\x02"
    assert uint32_be([]) == b""
