"""Deterministic CBOR encoder and strict decoder (sdcp_fast.protocol.cbor), on both codecs
(tests/protocol/conftest.py); test_cbor_parity.py holds them to each other."""

from __future__ import annotations

from typing import Any

import cbor2
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sdcp_fast.protocol.cbor import MAX_DEPTH, decode, decode_sequence, deterministic_cbor
from sdcp_fast.protocol.problems import BadRequest, SdcpProblem

pytestmark = pytest.mark.usefixtures("cbor_codec")

# RFC 8949 Appendix A, the entries SDCP's subset can hold (no floats, tags, undefined).
APPENDIX_A: list[tuple[Any, str]] = [
    (0, "00"), (1, "01"), (10, "0a"), (23, "17"), (24, "1818"), (25, "1819"), (100, "1864"),
    (1000, "1903e8"), (1000000, "1a000f4240"), (1000000000000, "1b000000e8d4a51000"),
    (18446744073709551615, "1bffffffffffffffff"), (-18446744073709551616, "3bffffffffffffffff"),
    (-1, "20"), (-10, "29"), (-100, "3863"), (-1000, "3903e7"),
    (False, "f4"), (True, "f5"), (None, "f6"),
    (b"", "40"), (b"\x01\x02\x03\x04", "4401020304"),
    ("", "60"), ("a", "6161"), ("IETF", "6449455446"), ("\"\\", "62225c"), ("\u00fc", "62c3bc"),
    ("\u6c34", "63e6b0b4"), ("\U00010151", "64f0908591"),
    ([], "80"), ([1, 2, 3], "83010203"), ([1, [2, 3], [4, 5]], "8301820203820405"),
    (list(range(1, 26)), "98190102030405060708090a0b0c0d0e0f101112131415161718181819"),
    ({}, "a0"), ({1: 2, 3: 4}, "a201020304"), ({"a": 1, "b": [2, 3]}, "a26161016162820203"),
    (["a", {"b": "c"}], "826161a161626163"),
    ({"a": "A", "b": "B", "c": "C", "d": "D", "e": "E"}, "a56161614161626142616361436164614461656145"),
]

# RFC 8949 Appendix A indefinite-length and non-shortest inputs: decoded, never produced.
DECODE_ONLY: list[tuple[str, Any]] = [
    ("5f42010243030405ff", b"\x01\x02\x03\x04\x05"),
    ("7f657374726561646d696e67ff", "streaming"),
    ("9fff", []),
    ("9f018202039f0405ffff", [1, [2, 3], [4, 5]]),
    ("9f01820203820405ff", [1, [2, 3], [4, 5]]),
    ("83018202039f0405ff", [1, [2, 3], [4, 5]]),
    ("83019f0203ff820405", [1, [2, 3], [4, 5]]),
    ("bf61610161629f0203ffff", {"a": 1, "b": [2, 3]}),
    ("826161bf61626163ff", ["a", {"b": "c"}]),
    ("bf6346756ef563416d7421ff", {"Fun": True, "Amt": -2}),
    ("1b0000000000000001", 1),  # a non-shortest head is well-formed
    ("5f4100ff", b"\x00"),
    ("7fff", ""),
]


@pytest.mark.parametrize(("value", "hex_"), APPENDIX_A, ids=[h for _, h in APPENDIX_A])
def test_appendix_a_encoding(value: Any, hex_: str) -> None:
    assert deterministic_cbor(value).hex() == hex_
    assert decode(bytes.fromhex(hex_)) == value


@pytest.mark.parametrize(("hex_", "value"), DECODE_ONLY, ids=[h for h, _ in DECODE_ONLY])
def test_appendix_a_decoding_of_indefinite_and_long_forms(hex_: str, value: Any) -> None:
    assert decode(bytes.fromhex(hex_)) == value


def test_map_keys_sorted_bytewise_by_encoding() -> None:
    # 10 (0a) < -1 (20) < h'78' (4178) < "b" (6162) < "aaa" (63616161): shorter text sorts first.
    value = {"aaa": 1, "b": 2, 10: 3, -1: 4, b"x": 5}
    assert deterministic_cbor(value).hex() == "a50a0320044178056162026361616101"


def test_mixed_key_types_sort_bytewise_not_length_first() -> None:
    # 24 encodes as 1818 (two bytes) and -1 as 20 (one byte): bytewise, 24 comes first.
    assert deterministic_cbor({-1: None, 24: None}).hex() == "a21818f620f6"


def test_tuple_and_bytearray_encode_like_list_and_bytes() -> None:
    assert deterministic_cbor((1, 2)) == deterministic_cbor([1, 2])
    assert deterministic_cbor(bytearray(b"ab")) == deterministic_cbor(b"ab")


@pytest.mark.parametrize("value", [1 << 64, -(1 << 64) - 1, 1.5, float("nan"), object(), {1, 2}, "\ud800"])
def test_encoder_refuses_values_outside_the_subset(value: Any) -> None:
    with pytest.raises(BadRequest):
        deterministic_cbor(value)


def test_encoder_refuses_keys_with_equal_encodings() -> None:
    class Twin(int):
        def __hash__(self) -> int:
            return id(self)

        def __eq__(self, other: object) -> bool:
            return other is self

    with pytest.raises(BadRequest, match="same encoding"):
        deterministic_cbor({Twin(1): 0, Twin(1): 1})


def test_encoder_bounds_nesting() -> None:
    value: Any = 0
    for _ in range(MAX_DEPTH + 2):
        value = [value]
    with pytest.raises(BadRequest, match="deeply"):
        deterministic_cbor(value)


REJECTED: dict[str, str] = {
    "empty input": "",
    "tag": "c11a514b67b0",
    "half float": "f93c00",
    "single float": "fa47c35000",
    "double float": "fb3ff199999999999a",
    "undefined": "f7",
    "simple 16": "f0",
    "simple 255": "f8ff",
    "reserved info 28": "1c",
    "reserved info 30": "5e",
    "indefinite integer": "1f",
    "indefinite negative": "3f",
    "trailing bytes": "0000",
    "truncated head": "19 01".replace(" ", ""),
    "truncated string": "4401",
    "array longer than input": "9bffffffffffffffff",
    "map longer than input": "a3010203",
    "break outside indefinite": "ff",
    "break in definite array": "81ff",
    "break as map value": "bf01ffff",
    "duplicate key": "a2616101616102",
    "array key": "a1800001",
    "bool key": "a1f501",
    "null key": "a1f601",
    "invalid utf-8": "62c328",
    "text chunk not text": "7f4161ff",
    "nested indefinite chunk": "5f5fffff",
    "text chunk splits a code point": "7f61c361bcff",
    "unterminated indefinite array": "9f01",
    "unterminated indefinite string": "5f41",
}


@pytest.mark.parametrize("hex_", list(REJECTED.values()), ids=list(REJECTED))
def test_decoder_rejects_with_bad_request(hex_: str) -> None:
    with pytest.raises(BadRequest):
        decode(bytes.fromhex(hex_))


def test_decoder_bounds_nesting() -> None:
    assert decode(b"\x81" * MAX_DEPTH + b"\x00") is not None
    with pytest.raises(BadRequest, match="deep"):
        decode(b"\x81" * (MAX_DEPTH + 1) + b"\x00")
    with pytest.raises(BadRequest, match="deep"):
        decode(b"\x9f" * 10_000)


def test_decoder_refuses_non_bytes() -> None:
    with pytest.raises(BadRequest):
        decode("00")  # type: ignore[arg-type]
    with pytest.raises(BadRequest):
        list(decode_sequence("00"))  # type: ignore[arg-type]


def test_decode_sequence_reads_items_back_to_back() -> None:
    assert list(decode_sequence(b"")) == []
    assert list(decode_sequence(bytes.fromhex("0182020361 61".replace(" ", "")))) == [1, [2, 3], "a"]
    with pytest.raises(BadRequest):
        list(decode_sequence(bytes.fromhex("0182")))


def test_decoder_accepts_memoryview_and_bytearray() -> None:
    assert decode(memoryview(b"\x83\x01\x02\x03")) == [1, 2, 3]
    assert decode(bytearray(b"\x01")) == 1


keys = st.one_of(st.integers(-(1 << 64), (1 << 64) - 1), st.text(max_size=8), st.binary(max_size=8))
scalars = st.one_of(
    st.integers(-(1 << 64), (1 << 64) - 1), st.booleans(), st.none(), st.binary(max_size=20), st.text(max_size=20),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=5), st.dictionaries(keys, inner, max_size=5)),
    max_leaves=30,
)


@given(values)
def test_roundtrip_and_idempotent_encoding(value: Any) -> None:
    encoded = deterministic_cbor(value)
    decoded = decode(encoded)
    assert deterministic_cbor(decoded) == encoded


text_keyed = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=5), st.dictionaries(st.text(max_size=30), inner, max_size=5)),
    max_leaves=30,
)


@given(text_keyed)
def test_agrees_with_cbor2_canonical_on_text_keys(value: Any) -> None:
    # cbor2's canonical mode orders keys length-first (RFC 7049); that equals RFC 8949's bytewise
    # order when all keys share a major type, as SDCP's text keys do. Mixed key types differ:
    # see test_mixed_key_types_sort_bytewise_not_length_first.
    assert deterministic_cbor(value) == cbor2.dumps(value, canonical=True)
    assert cbor2.loads(deterministic_cbor(value)) == value


@given(values)
def test_decodes_cbor2_non_canonical_output(value: Any) -> None:
    assert deterministic_cbor(decode(cbor2.dumps(value))) == deterministic_cbor(value)


@given(st.dictionaries(keys, scalars, min_size=2, max_size=8))
def test_map_order_ignores_insertion_order(value: dict[Any, Any]) -> None:
    reordered = dict(reversed(list(value.items())))
    assert deterministic_cbor(reordered) == deterministic_cbor(value)
    encoded_keys = [deterministic_cbor(k) for k in decode(deterministic_cbor(value))]
    assert encoded_keys == sorted(encoded_keys)


@settings(max_examples=500)
@given(st.binary(max_size=64))
def test_random_bytes_raise_only_problems(data: bytes) -> None:
    try:
        decode(data)
    except SdcpProblem:
        pass


@settings(deadline=None)  # one decode per prefix: slow under coverage on a loaded machine
@given(values)
def test_every_proper_prefix_of_an_encoding_is_bad_request(value: Any) -> None:
    encoded = deterministic_cbor(value)
    for end in range(len(encoded)):
        with pytest.raises(BadRequest):
            decode(encoded[:end])


foreign = st.recursive(
    st.one_of(scalars, st.floats(allow_nan=False), st.builds(cbor2.CBORTag, st.integers(0, 2**32), st.integers(0, 9))),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=4), inner, max_size=4)),
    max_leaves=12,
)


def _has_foreign(value: Any) -> bool:
    if isinstance(value, (float, cbor2.CBORTag)):
        return True
    if isinstance(value, list):
        return any(_has_foreign(v) for v in value)
    if isinstance(value, dict):
        return any(_has_foreign(v) for v in value.values())
    return False


@given(foreign)
def test_floats_and_tags_from_other_encoders_are_bad_request(value: Any) -> None:
    data = cbor2.dumps(value)
    if _has_foreign(value):
        with pytest.raises(BadRequest):
            decode(data)
    else:
        assert deterministic_cbor(decode(data)) == deterministic_cbor(value)
