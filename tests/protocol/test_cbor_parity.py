"""The native CBOR codec (sdcp_fast.protocol._cbor_native) against the Python one, the
reference: the same bytes out, the same values back, and the same refusals (class and detail)
for the same inputs, valid, random or malformed."""

from __future__ import annotations

import enum
import random
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sdcp_fast.protocol import cbor
from sdcp_fast.protocol.cbor import MAX_DEPTH, py_decode, py_deterministic_cbor
from tests.protocol.cbor_codecs import require_native_cbor


@pytest.fixture(scope="module")
def native() -> Any:
    require_native_cbor()
    return cbor._load()[0]


def outcome(fn: Callable[[Any], Any], arg: Any) -> tuple[str, Any]:
    """What ``fn(arg)`` does: ("ok", value with its types) or (exception class, detail)."""
    try:
        return "ok", typed(fn(arg))
    except Exception as exc:  # the comparison is the point: any class, same on both sides
        return type(exc).__name__, str(exc)


def typed(value: Any) -> Any:
    """``value`` with each item's type beside it: 1 == True and b"" == bytearray() must not pass."""
    if isinstance(value, list):
        return ("list", [typed(v) for v in value])
    if isinstance(value, dict):
        return ("dict", [(typed(k), typed(v)) for k, v in value.items()])
    return (type(value).__name__, value)


def same(native_fn: Callable[[Any], Any], py_fn: Callable[[Any], Any], arg: Any) -> tuple[str, Any]:
    got, want = outcome(native_fn, arg), outcome(py_fn, arg)
    assert got == want, f"native {got!r} != python {want!r} for {arg!r:.200}"
    return got


keys = st.one_of(st.integers(-(1 << 64), (1 << 64) - 1), st.text(max_size=8), st.binary(max_size=8))
scalars = st.one_of(
    st.integers(-(1 << 64), (1 << 64) - 1), st.integers(-300, 70000), st.booleans(), st.none(),
    st.binary(max_size=40), st.text(max_size=20),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=6), st.tuples(inner, inner),
                            st.dictionaries(keys, inner, max_size=6)),
    max_leaves=40,
)


@settings(max_examples=300, deadline=None)  # timing is not the point; the box is shared
@given(values)
def test_random_values_encode_to_the_same_bytes_and_decode_to_the_same_values(native: Any, value: Any) -> None:
    kind, encoded = same(native.encode, py_deterministic_cbor, value)
    assert kind == "ok"
    same(native.decode, py_decode, encoded[1])


# Heads and stop codes that break things: indefinite forms, breaks, tags, floats, simple
# values, reserved infos, long arguments, nesting.
NASTY = bytes([0xFF, 0x1F, 0x3F, 0x5F, 0x7F, 0x9F, 0xBF, 0xC0, 0xD8, 0xF7, 0xF8, 0xF9, 0xFA, 0xFB, 0xF0, 0x1C,
               0x5E, 0x7D, 0x9B, 0xBB, 0x81, 0xA1, 0x18, 0x19, 0x1A, 0x1B, 0x40, 0x60, 0x80, 0xA0, 0xF4, 0xF5, 0xF6])


def mutations(rng: random.Random, data: bytes) -> Iterator[bytes]:
    yield data
    for _ in range(6):
        b = bytearray(data)
        for _ in range(rng.randint(1, 3)):
            op = rng.randrange(5)
            at = rng.randrange(len(b) + 1)
            if op == 0 and b:
                b[min(at, len(b) - 1)] = rng.randrange(256)
            elif op == 1:
                b.insert(at, rng.choice(NASTY))
            elif op == 2 and b:
                del b[min(at, len(b) - 1)]
            elif op == 3:
                del b[at:]
            else:
                b[at:at] = bytes(rng.choice(NASTY) for _ in range(rng.randint(1, 4)))
        yield bytes(b)


def random_value(rng: random.Random, depth: int = 0) -> Any:
    pick = rng.randrange(10 if depth < 4 else 6)
    if pick == 0:
        return rng.choice([0, 23, 24, 255, 256, 65535, 65536, 2**32, 2**64 - 1, -1, -24, -25, -(2**64)])
    if pick == 1:
        return rng.choice([True, False, None])
    if pick == 2:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(30)))
    if pick == 3:
        return "".join(rng.choice("aZ\u00fc\u6c34\U00010151") for _ in range(rng.randrange(12)))
    if pick in (4, 5):
        return rng.randrange(-1000, 100000)
    if pick in (6, 7):
        return [random_value(rng, depth + 1) for _ in range(rng.randrange(5))]
    return {random_value(rng, 9) if rng.random() < 0.3 else f"k{i}": random_value(rng, depth + 1)
            for i in range(rng.randrange(5))}


def test_malformed_inputs_are_refused_alike(native: Any) -> None:
    rng = random.Random(20260402)
    refused = 0
    for _ in range(1500):
        for data in mutations(rng, py_deterministic_cbor(random_value(rng))):
            refused += same(native.decode, py_decode, data)[0] != "ok"
    for _ in range(3000):
        data = bytes(rng.choice(NASTY) if rng.random() < 0.5 else rng.randrange(256) for _ in range(rng.randrange(12)))
        refused += same(native.decode, py_decode, data)[0] != "ok"
    assert refused > 3000  # the fuzz reached the refusals, not only valid items


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=48))
def test_random_bytes_are_decoded_or_refused_alike(native: Any, data: bytes) -> None:
    same(native.decode, py_decode, data)


def nested(depth: int, opener: bytes, inner: bytes, closer: bytes = b"") -> bytes:
    return opener * depth + inner + closer * depth


@pytest.mark.parametrize("depth", [MAX_DEPTH - 1, MAX_DEPTH, MAX_DEPTH + 1, MAX_DEPTH + 2])
@pytest.mark.parametrize(("opener", "inner", "closer"), [
    (b"\x81", b"\x00", b""), (b"\x81", b"\x80", b""), (b"\x81", b"\x9f\xff", b""), (b"\x81", b"\xa0", b""),
    (b"\x81", b"\xa1\x00\x00", b""), (b"\x9f", b"\x00", b"\xff"), (b"\xa1\x00", b"\x00", b""),
    (b"\xbf\x00", b"\x00", b"\xff"), (b"\x81", b"\x5f\x41\x00\xff", b""),
])
def test_depth_limits_agree(native: Any, depth: int, opener: bytes, inner: bytes, closer: bytes) -> None:
    same(native.decode, py_decode, nested(depth, opener, inner, closer))


@pytest.mark.parametrize("depth", [MAX_DEPTH - 1, MAX_DEPTH, MAX_DEPTH + 1, MAX_DEPTH + 2])
@pytest.mark.parametrize("leaf", [0, 5, -1, True, None, b"x", "x", [], {}, 2**64 - 1])
def test_encoder_depth_limits_agree(native: Any, depth: int, leaf: Any) -> None:
    value: Any = leaf
    for level in range(depth):
        value = [value] if level % 2 else {"k": value}
    same(native.encode, py_deterministic_cbor, value)
    value = leaf
    for _ in range(depth):
        value = [value]  # plain uints in an array skip the depth check in both
    same(native.encode, py_deterministic_cbor, value)


class Colour(enum.IntEnum):
    RED = 1


class Twin(int):
    def __hash__(self) -> int:
        return id(self)

    def __eq__(self, other: object) -> bool:
        return other is self


class Frozen(Mapping[Any, Any]):
    def __init__(self, items: dict[Any, Any]) -> None:
        self._items = items

    def __getitem__(self, key: Any) -> Any:
        return self._items[key]

    def __iter__(self) -> Iterator[Any]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)


class Counted(Frozen):
    """A one-entry map that counts how often an encoder reads it, and gives up past a budget (an
    encoder that reads it 2**depth times fails here instead of running for hours)."""

    reads = 0

    def __init__(self, value: Any) -> None:
        super().__init__({"k": value})

    def items(self) -> Any:
        Counted.reads += 1
        if Counted.reads > 10_000:
            raise RuntimeError("read too often")
        return list(self._items.items())


@pytest.mark.parametrize("depth", [MAX_DEPTH, MAX_DEPTH + 2])
def test_a_map_too_deep_is_refused_without_encoding_it_again_at_every_level(native: Any, depth: int) -> None:
    # A map that fails is encoded again in the Python encoder's order, to raise its error; the
    # maps inside that second pass must not each start over too.
    value: Any = 0
    for _ in range(depth):
        value = Counted(value)
    Counted.reads = 0
    got = outcome(native.encode, value)
    reads = Counted.reads
    assert got == outcome(py_deterministic_cbor, value)
    assert reads <= (depth + 1) ** 2, reads


ODD_VALUES: list[Any] = [
    1 << 64, -(1 << 64) - 1, -(1 << 64), (1 << 64) - 1, -(1 << 63), -(1 << 63) - 1, 1 << 63, 1.5, float("nan"),
    object(), {1, 2}, "\ud800", ["ok", "\udfff"], Colour.RED, [Colour.RED, 2], {Colour.RED: Colour.RED},
    {Twin(1): 0, Twin(1): 1}, {Twin(1): 0, Twin(1): 1.5}, Frozen({"b": 1, "a": [2]}), Frozen({}),
    bytearray(b"ab"), memoryview(b"abcd"), memoryview(b"abcdef")[::2], memoryview(bytes(range(8))).cast("I"),
    {"b": 1, "a": 2, "": 3, "aa": 4, 0: 5, -1: 6, b"": 7}, {1: {2: {3: [{}]}}}, ((1, 2), [3]), [True, 1, False, 0],
    {"x": float("inf")}, [1, 2, 3.0], {b"k": None, "k": None},
    # The first error in insertion order wins, though the map is written in key order.
    {"z": 1.5, "a": object()}, {"z": [1.5], b"a": 2**70}, {"z": {Twin(1): 0, Twin(1): 1}, "a": set()},
    {"z": 0, 1.5: 0, "a": 2**70}, {"big": bytes(70_000), "a": 1, "": [b"x" * 300]},
]


@pytest.mark.parametrize("value", ODD_VALUES, ids=[f"v{i}" for i in range(len(ODD_VALUES))])
def test_encoder_odd_values_agree(native: Any, value: Any) -> None:
    same(native.encode, py_deterministic_cbor, value)


@pytest.mark.parametrize("data", [
    "abc", 5, None, bytearray(b"\x83\x01\x02\x03"), memoryview(b"\x00\x82\x01\x02")[1:],
    memoryview(b"\x82\x00\x01\x00\x02")[::2], memoryview(b"\x01\x00\x00\x00").cast("I"),
], ids=["str", "int", "none", "bytearray", "slice", "strided", "cast"])
def test_decoder_inputs_agree(native: Any, data: Any) -> None:
    same(native.decode, py_decode, data)


@pytest.mark.parametrize("hex_", ["", "01820203", "0182", "01ff", "0000f6", "01c0", "6161"])
def test_sequences_agree(hex_: str) -> None:
    require_native_cbor()

    def run(name: str) -> tuple[list[Any], tuple[str, str] | None]:
        cbor.use(name)
        items: list[Any] = []
        try:
            for item in cbor.decode_sequence(bytes.fromhex(hex_)):
                items.append(typed(item))
        except Exception as exc:
            return items, (type(exc).__name__, str(exc))
        finally:
            cbor.use(None)
        return items, None

    assert run(cbor.C) == run(cbor.PY)


@pytest.mark.parametrize("values", [
    [], (), [0], [2**64 - 1], (3, 2**32), [2**64], [-1], [1, -(2**70)], [True], [Colour.RED], [1.0], [None],
    "abc", b"\x01", bytearray(b"\x01"), range(3), {1: 2}, None, 7,
], ids=lambda v: repr(v)[:20])
def test_token_list_checks_agree(native: Any, values: Any) -> None:
    assert native.all_uints(values) is cbor.py_all_uints(values)


def test_large_byte_strings_pass_whole(native: Any) -> None:
    blob = random.Random(7).randbytes(16 << 20)
    record = {"entry": {"rows": blob, "shape": [4, 1 << 20]}, "n": 3}
    encoded = native.encode(record)
    assert encoded == py_deterministic_cbor(record)
    decoded = native.decode(memoryview(encoded))
    assert type(decoded["entry"]["rows"]) is bytes and decoded["entry"]["rows"] == blob
    with pytest.raises(cbor.BadRequest, match="1 bytes after"):
        native.decode(encoded + b"\x00")
    with pytest.raises(cbor.BadRequest, match="ends inside"):
        native.decode(encoded[:-1])


def test_the_environment_picks_the_codec(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SDCP_CBOR", "py")
    assert cbor.implementation() == cbor.PY
    assert cbor.deterministic_cbor([1]) == b"\x81\x01"
    monkeypatch.setenv("SDCP_CBOR", "bogus")
    with pytest.raises(ValueError, match="SDCP_CBOR"):
        cbor.implementation()
    with pytest.raises(ValueError, match="unknown"):
        cbor.use("fast")
    monkeypatch.delenv("SDCP_CBOR")
    assert cbor.implementation() == (cbor.C if cbor.available() else cbor.PY)


def test_without_the_native_codec_python_serves_and_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cbor, "_native", (None, "native CBOR is missing (test)"))
    monkeypatch.delenv("SDCP_CBOR", raising=False)
    try:
        assert not cbor.available() and "missing" in cbor.status()
        assert cbor.implementation() == cbor.PY
        assert cbor.decode(cbor.deterministic_cbor({"a": [1]})) == {"a": [1]}
        monkeypatch.setenv("SDCP_CBOR", "c")
        with pytest.raises(ImportError, match="missing"):
            cbor.implementation()
    finally:
        monkeypatch.undo()
        cbor.use(None)


def test_the_codec_is_chosen_at_the_first_call(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SDCP_CBOR", "py")
    firsts = {"_encoder": cbor._first_encode, "_decoder": cbor._first_decode, "_item_at": cbor._first_item_at,
              "_all_uints": cbor._first_all_uints}
    calls: list[Callable[[], Any]] = [
        lambda: cbor.deterministic_cbor([1]), lambda: cbor.decode(b"\x81\x01"),
        lambda: list(cbor.decode_sequence(b"\x01\x02")), lambda: cbor.all_uints([1]),
    ]
    expected: list[Any] = [b"\x81\x01", [1], [1, 2], True]
    try:
        for name, call, want in zip(firsts, calls, expected, strict=True):
            for attr, first in firsts.items():
                setattr(cbor, attr, first)
            assert call() == want, name
            assert cbor._encoder is cbor.py_deterministic_cbor and cbor._all_uints is cbor.py_all_uints
    finally:
        monkeypatch.undo()
        cbor.use(None)
