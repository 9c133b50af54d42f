"""The native message pair (csrc/cbor/, ``compile_message``/``dump_message``/``parse_message``)
against the Python path it stands in for: for every message class, the same bytes out of
``encode`` and the same message or problem (class and detail) out of ``decode``, for valid
messages, members broken one at a time, maps in loose but valid encodings, and mangled bytes."""

from __future__ import annotations

import copy
import dataclasses
import enum
import random
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sdcp_fast.protocol import cbor, message_codec
from sdcp_fast.protocol.messages import Action, Proposal, Status, Verdict
from sdcp_fast.protocol.problems import SdcpProblem
from tests.protocol.cbor_codecs import require_native_cbor
from tests.protocol.message_strategies import BY_CLASS, EXAMPLES, SAMPLING, STATUS

CLASSES = [cls for cls, _, _ in BY_CLASS]


@pytest.fixture(scope="module", autouse=True)
def native() -> Iterator[Any]:
    require_native_cbor()
    cbor.use(cbor.C)
    try:
        yield cbor.native_messages()
    finally:
        cbor.use(None)


def shape(value: Any) -> Any:
    """``value`` with every type beside it (1 == True must not pass), members in __dict__ order."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return type(value).__name__, [(k, shape(v)) for k, v in vars(value).items()]
    if isinstance(value, (tuple, list)):
        return type(value).__name__, [shape(v) for v in value]
    return type(value).__name__, value


def outcome(call: Callable[[], Any]) -> tuple[str, Any]:
    try:
        return "ok", shape(call())
    except SdcpProblem as exc:
        return type(exc).__name__, exc.detail


def python_path(call: Callable[[], Any]) -> tuple[str, Any]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(message_codec, "_native", lambda cls: None)
        return outcome(call)


def alike(call: Callable[[], Any]) -> tuple[str, Any]:
    got, want = outcome(call), python_path(call)
    assert got == want, f"native {got!r:.300} != python {want!r:.300}"
    return got


def test_every_message_class_has_a_native_codec_that_takes_plain_values(native: Any) -> None:
    for cls in CLASSES:
        codec = message_codec._native(cls)
        assert codec is not None, cls
        msg = EXAMPLES[cls]
        data = native.dump_message(codec, msg)
        assert data == cbor.deterministic_cbor(msg.to_map())
        parsed = native.parse_message(codec, data)
        assert parsed == msg and python_path(lambda: cls.decode(data)) == ("ok", shape(parsed))  # noqa: B023


@pytest.mark.parametrize(("cls", "strategy"), [(c, s) for c, s, _ in BY_CLASS], ids=[c.__name__ for c in CLASSES])
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_valid_messages_give_the_same_bytes_and_messages(cls: type[Any], strategy: Any, data: st.DataObject) -> None:
    msg = data.draw(strategy)
    got = alike(msg.encode)
    assert got[0] == "ok"
    assert alike(lambda: cls.decode(msg.encode()))[0] == "ok"
    assert cls.decode(msg.encode()) == msg
    rng = random.Random(data.draw(st.integers(0, 2**32)))
    alike(lambda: cls.decode(loose(msg.to_map(), rng)))


# -- encoding: one member at a time set to what the table may or may not take ----------------------

class Small(enum.IntEnum):
    FIVE = 5


class IntSub(int):
    pass


class BytesSub(bytes):
    pass


class StrSub(str):
    pass


ENCODE_ODD = [
    None, -1, 0, 1, 2, 7, 100, 101, 1000, 1001, 2**64 - 1, 2**64, True, False, 1.5, "x", "", "\ud800", b"", b"x" * 16,
    b"y" * 32, b"z" * 33, bytearray(16), BytesSub(b"s" * 16), StrSub("t"), IntSub(5), Small.FIVE, Action.FAIL, [], [5],
    (), (3,), (True,), (-1,), (2**64 - 1,), (2**64,), (IntSub(1),), ("a",), {}, {"n": 1}, STATUS, SAMPLING,
    Status(instance="\ud800", role=1, load=1, queue=1, ttl_ms=1), Status(instance="i", role=3, load=1, queue=1, ttl_ms=1),
]


@pytest.mark.parametrize("cls", CLASSES, ids=[c.__name__ for c in CLASSES])
def test_a_broken_member_encodes_or_fails_alike(cls: type[Any]) -> None:
    base = EXAMPLES[cls]
    for member in cls._members:
        for value in ENCODE_ODD:
            broken = dataclasses.replace(base, **{member.attr: value})
            alike(broken.encode)


# -- decoding: maps with one member broken, dropped or added, here or one map down ---------------

DECODE_ODD = [
    None, -1, 0, 1, 2, 3, 7, 64, 65, 100, 101, 255, 256, 1000, 1001, 65536, 2**32, 2**64 - 1, -(2**64), True, False,
    "x", "", b"", b"x" * 16, b"y" * 32, b"z" * 33, [], [1, 2], [True], [-1], [2**64 - 1], [[1]], ["a"], [b"y" * 32],
    {}, {"n": 1}, {"instance": "i"}, {1: 2},
]


@pytest.mark.parametrize(("cls", "strategy"), [(c, s) for c, s, _ in BY_CLASS], ids=[c.__name__ for c in CLASSES])
@settings(max_examples=80, deadline=None)
@given(data=st.data())
def test_a_broken_map_decodes_or_fails_alike(cls: type[Any], strategy: Any, data: st.DataObject) -> None:
    raw = data.draw(strategy).to_map()
    for _ in range(data.draw(st.integers(1, 2))):
        target = raw
        nested = [k for k, v in raw.items() if isinstance(v, dict)]
        if nested and data.draw(st.booleans()):
            target = raw[data.draw(st.sampled_from(nested))]
        key = data.draw(st.sampled_from([*target, "unknown", "x", 7, b"k"]))
        if data.draw(st.booleans()) and key in target:
            del target[key]
        else:
            target[key] = copy.deepcopy(data.draw(st.sampled_from(DECODE_ODD)))  # the loop may change it: not the shared one
    alike(lambda: cls.decode(cbor.deterministic_cbor(raw)))
    rng = random.Random(data.draw(st.integers(0, 2**32)))
    alike(lambda: cls.decode(loose(raw, rng)))
    encoded = cbor.deterministic_cbor(raw)
    for mangled in mutations(rng, encoded):
        alike(lambda: cls.decode(mangled))  # noqa: B023 - called at once


def test_borderline_bytes_decode_alike() -> None:
    good = EXAMPLES[Proposal].encode()
    for data in [
        good + b"\x00",                                  # a byte after the map
        good[:-1],                                       # cut short
        b"\xbf" + good[1:] + b"\xff",                    # the same map, indefinite
        good[:1] + b"\x70" + b"session" + good[9:],      # a key with a wrong length
        bytearray(good), memoryview(good),               # not bytes: the Python path's to take
        b"\xc0" + good,                                  # a tag
        b"", b"\xa0", b"\x80",
    ]:
        alike(lambda: Proposal.decode(data))  # noqa: B023 - called at once
    # A duplicate key, the same key in two spellings of its head, and a 9-byte uint head.
    entries = cbor.deterministic_cbor(EXAMPLES[Verdict].to_map())[1:]
    alike(lambda: Verdict.decode(b"\xac" + entries + b"\x64load\x01"))
    alike(lambda: Verdict.decode(b"\xac" + entries + b"\x78\x04load\x01"))
    # Keys the class does not define: twice, not UTF-8, or with a value no SDCP message holds.
    for extra in [b"\x61x\x01\x61x\x02", b"\x61x\x01\x61y\x02", b"\x61\xff\x01\x61y\x02", b"\x61x\xc0\x01\x61y\x02",
                  b"\x61x\x9f\xff\x61y\xbf\xff", b"\x61x\x5f\x41a\xff\x61y\xf9\x00\x00"]:
        alike(lambda: Verdict.decode(b"\xad" + entries + extra))  # noqa: B023 - called at once
    wide = cbor.deterministic_cbor({**EXAMPLES[Verdict].to_map(), "round": 0})
    at = wide.index(b"\x65round") + 6
    assert wide[at] == 0
    assert shape(Verdict.decode(wide[:at] + b"\x1b" + bytes(8) + wide[at + 1:])) == shape(Verdict.decode(wide))


def test_without_the_native_codec_the_python_path_serves() -> None:
    msg = EXAMPLES[Proposal]
    native_bytes = msg.encode()
    cbor.use(cbor.PY)
    try:
        assert cbor.native_messages() is None
        assert msg.encode() == native_bytes
        assert Proposal.decode(native_bytes) == msg
    finally:
        cbor.use(cbor.C)


# -- helpers -----------------------------------------------------------------------------------------

def head(major: int, arg: int, rng: random.Random) -> bytes:
    """A head for ``arg``, at random in a longer form than the shortest (still valid CBOR)."""
    widths = [w for w in (0, 1, 2, 4, 8) if (w == 0 and arg < 24) or (w and arg < 1 << (8 * w))]
    width = rng.choice(widths)
    if width == 0:
        return bytes([major << 5 | arg])
    return bytes([major << 5 | {1: 24, 2: 25, 4: 26, 8: 27}[width]]) + arg.to_bytes(width, "big")


def loose(value: Any, rng: random.Random) -> bytes:
    """``value`` in a valid but not deterministic encoding: long heads, indefinite lengths,
    keys in any order."""
    if isinstance(value, bool) or value is None or (isinstance(value, int) and value < 0):
        return cbor.deterministic_cbor(value)
    if isinstance(value, int):
        return head(0, value, rng)
    if isinstance(value, (bytes, str)):
        raw, major = (value, 2) if isinstance(value, bytes) else (value.encode(), 3)
        if rng.random() < 0.2:
            cut = rng.randint(0, len(raw))
            return bytes([major << 5 | 31]) + head(major, cut, rng) + raw[:cut] + head(major, len(raw) - cut, rng) \
                + raw[cut:] + b"\xff" if major == 2 or _splits_utf8(raw, cut) else cbor.deterministic_cbor(value)
        return head(major, len(raw), rng) + raw
    if isinstance(value, (list, tuple)):
        items = b"".join(loose(v, rng) for v in value)
        return (b"\x9f" + items + b"\xff") if rng.random() < 0.2 else head(4, len(value), rng) + items
    items_ = list(value.items())
    rng.shuffle(items_)
    body = b"".join(loose(k, rng) + loose(v, rng) for k, v in items_)
    return (b"\xbf" + body + b"\xff") if rng.random() < 0.2 else head(5, len(items_), rng) + body


def _splits_utf8(raw: bytes, cut: int) -> bool:
    try:
        raw[:cut].decode()
        raw[cut:].decode()
    except UnicodeDecodeError:
        return False
    return True


NASTY = bytes([0xFF, 0x1F, 0x5F, 0x7F, 0x9F, 0xBF, 0xC0, 0xF7, 0xF9, 0x1C, 0x18, 0x1B, 0x40, 0x60, 0x80, 0xA0, 0xF4,
               0xF5, 0xF6, 0x00, 0x17, 0x61, 0x70])


def mutations(rng: random.Random, data: bytes) -> Iterator[bytes]:
    for _ in range(4):
        b = bytearray(data)
        for _ in range(rng.randint(1, 2)):
            op, at = rng.randrange(4), rng.randrange(len(b) + 1)
            if op == 0 and b:
                b[min(at, len(b) - 1)] = rng.randrange(256)
            elif op == 1:
                b.insert(at, rng.choice(NASTY))
            elif op == 2 and b:
                del b[min(at, len(b) - 1)]
            else:
                del b[at:]
        yield bytes(b)
