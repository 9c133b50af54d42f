"""The CBOR subset SDCP uses (RFC 8949), written out so that it is provably what the draft asks.

Encoding is the core deterministic encoding of RFC 8949 §4.2.1: shortest argument heads,
definite lengths, map keys sorted bytewise by their own encodings. It is the encoding the
contract digest (§4.1) is computed over.

Decoding is strict and bounded: every failure is :class:`BadRequest`, never another
exception. It accepts definite and indefinite lengths and non-shortest heads (a receiver
need not insist on the deterministic form), and rejects what no SDCP message holds: tags,
floating-point numbers, simple values other than false/true/null, duplicate or composite
map keys, and bytes after the top-level item (see docs/interpretations.md).

Two codecs do exactly this, check for check and detail for detail: the Python one written
out below (the reference, and the fallback) and ``sdcp_fast.protocol._cbor_native``, its
C++ twin from ``csrc/cbor/`` (one memcpy per byte string, no Python work per byte), built
where the C++ extensions are. Which one runs (:func:`implementation`): ``SDCP_CBOR=py`` the
Python codec, ``SDCP_CBOR=c`` the native one (an error when it is not built), unset: the
native one when built (:func:`status` says why not), else Python. Tests pin one with :func:`use`.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from types import ModuleType
from typing import Any

from sdcp_fast.protocol.problems import BadRequest

UINT64_MAX = (1 << 64) - 1
MAX_DEPTH = 32  # far above the deepest SDCP message (session-open > contract > sampling)

_MT_UINT, _MT_NINT, _MT_BSTR, _MT_TSTR, _MT_ARRAY, _MT_MAP, _MT_TAG, _MT_SIMPLE = range(8)
_BREAK = 0xFF
_FALSE, _TRUE, _NULL = b"\xf4", b"\xf5", b"\xf6"


def _head(major: int, arg: int) -> bytes:
    mt = major << 5
    if arg < 24:
        return bytes((mt | arg,))
    if arg < 0x100:
        return bytes((mt | 24, arg))
    if arg < 0x10000:
        return bytes((mt | 25,)) + arg.to_bytes(2, "big")
    if arg < 0x100000000:
        return bytes((mt | 26,)) + arg.to_bytes(4, "big")
    return bytes((mt | 27,)) + arg.to_bytes(8, "big")


def deterministic_cbor(value: Any) -> bytes:
    """``value`` in RFC 8949 §4.2.1 core deterministic encoding.

    Accepts int (-2**64 .. 2**64-1), bool, None, bytes, str, list/tuple and dict (any
    Mapping). Anything else, an out-of-range integer included, is :class:`BadRequest`.
    """
    return _encoder(value)


def decode(data: bytes | bytearray | memoryview) -> Any:
    """The single CBOR data item in ``data``; :class:`BadRequest` for anything else."""
    return _decoder(data)


def decode_sequence(data: bytes | bytearray | memoryview) -> Iterator[Any]:
    """The items of a CBOR sequence (RFC 8742): zero or more items back to back."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise BadRequest("CBOR input must be bytes")
    buf = bytes(data)
    pos = 0
    while pos < len(buf):
        value, pos = _item_at(buf, pos)
        yield value


def decode_members(data: bytes, keys: Sequence[str], max_items: int) -> dict[str, Any] | None:
    """The single CBOR data item in ``data``, checked as :func:`decode` checks it, with only
    the members of a top-level map named in ``keys`` built: a dict of those, or None when the
    item is not a map. The native codec checks with the GIL released and builds nothing for
    the other members; the members built may hold at most ``max_items`` data items between
    them (:class:`BadRequest` otherwise)."""
    return _members(data, list(keys), max_items)


def all_uints(values: Any) -> bool:
    """True when ``values`` is a list or tuple of plain ints in [0, 2**64): a token list
    that needs no check per item. False says nothing: the caller checks each item then."""
    return _all_uints(values)


# -- which codec -------------------------------------------------------------------------------

PY, C = "py", "c"
_native: tuple[ModuleType | None, str] | None = None
_chosen: str | None = None  # use(); None: from the environment


def _load() -> tuple[ModuleType | None, str]:
    global _native
    if _native is None:
        try:
            _native = importlib.import_module("sdcp_fast.protocol._cbor_native"), "loaded"
        except ImportError as exc:
            _native = None, (f"native CBOR (sdcp_fast.protocol._cbor_native) is missing ({exc}); build it with "
                             "`make native` (needs a C++17 compiler) - using the Python codec meanwhile")
    return _native


def available() -> bool:
    return _load()[0] is not None


def status() -> str:
    """One line: 'loaded' or why the native codec is missing."""
    return _load()[1]


def implementation() -> str:
    """``c`` or ``py``: the codec the module's functions run now."""
    return _select()


def use(name: str | None) -> None:
    """Pin the codec (``py``, ``c``, or None for the environment's choice); ``c`` when it is
    not built is :class:`ImportError` with :func:`status`'s reason."""
    global _chosen
    if name not in (None, PY, C):
        raise ValueError(f"unknown CBOR codec {name!r}")
    _chosen = name
    _select()


def native_messages() -> ModuleType | None:
    """The native module while the native codec is the one chosen (its message functions,
    ``compile_message``, ``dump_message`` and ``parse_message``, stand in for
    :mod:`sdcp_fast.protocol.message_codec`'s generated pair), else None."""
    if _encoder is _first_encode:  # nothing chosen yet
        _select()
    return _messages


def _select() -> str:
    global _encoder, _decoder, _item_at, _all_uints, _members, _messages
    wanted = _chosen if _chosen is not None else os.environ.get("SDCP_CBOR", "").strip().lower()
    if wanted not in ("", PY, C):
        raise ValueError(f"SDCP_CBOR={wanted!r}: use py or c")
    mod = None if wanted == PY else _load()[0]
    if mod is None:
        if wanted == C:
            raise ImportError(status())
        _encoder, _decoder, _item_at, _all_uints = py_deterministic_cbor, py_decode, _py_item_at, py_all_uints
        _members, _messages = py_decode_members, None
        return PY
    _encoder, _decoder, _item_at, _all_uints = mod.encode, mod.decode, mod.decode_at, mod.all_uints
    _members = mod.decode_members
    _messages = mod if hasattr(mod, "parse_message") else None  # an older build has none
    return C


def _first_encode(value: Any) -> bytes:
    _select()
    return _encoder(value)


def _first_decode(data: bytes | bytearray | memoryview) -> Any:
    _select()
    return _decoder(data)


def _first_item_at(buf: bytes, pos: int) -> tuple[Any, int]:
    _select()
    return _item_at(buf, pos)


def _first_all_uints(values: Any) -> bool:
    _select()
    return _all_uints(values)


def _first_members(data: bytes, keys: list[str], max_items: int) -> dict[str, Any] | None:
    _select()
    return _members(data, keys, max_items)


# Chosen at the first call (the native module loads then, not at import).
_encoder: Callable[[Any], bytes] = _first_encode
_decoder: Callable[[bytes | bytearray | memoryview], Any] = _first_decode
_item_at: Callable[[bytes, int], tuple[Any, int]] = _first_item_at
_all_uints: Callable[[Any], bool] = _first_all_uints
_members: Callable[[bytes, list[str], int], dict[str, Any] | None] = _first_members
_messages: ModuleType | None = None


# -- the Python codec (the reference) ----------------------------------------------------------

def py_deterministic_cbor(value: Any) -> bytes:
    """:func:`deterministic_cbor` in Python."""
    out: list[bytes] = []
    _encode(value, out, 0)
    return b"".join(out)


def _encode(value: Any, out: list[bytes], depth: int) -> None:
    if depth > MAX_DEPTH:
        raise BadRequest("value nested too deeply to encode")
    # bool before int: bool is an int subclass in Python but a simple value in CBOR.
    if value is False:
        out.append(_FALSE)
    elif value is True:
        out.append(_TRUE)
    elif value is None:
        out.append(_NULL)
    elif isinstance(value, int):
        if 0 <= value <= UINT64_MAX:
            out.append(_head(_MT_UINT, value))
        elif -(1 << 64) <= value < 0:
            out.append(_head(_MT_NINT, -1 - value))
        else:
            raise BadRequest(f"integer {value} is outside the CBOR 64-bit range")
    elif isinstance(value, (bytes, bytearray, memoryview)):
        raw = bytes(value)
        out.append(_head(_MT_BSTR, len(raw)))
        out.append(raw)
    elif isinstance(value, str):
        try:
            raw = value.encode("utf-8")
        except UnicodeEncodeError as exc:  # lone surrogates have no UTF-8 form
            raise BadRequest("text is not valid Unicode") from exc
        out.append(_head(_MT_TSTR, len(raw)))
        out.append(raw)
    elif isinstance(value, (list, tuple)):
        out.append(_head(_MT_ARRAY, len(value)))
        for item in value:
            # Token lists dominate message size: plain uints skip the dispatch below.
            if type(item) is int and 0 <= item <= UINT64_MAX:
                out.append(_head(_MT_UINT, item))
            else:
                _encode(item, out, depth + 1)
    elif isinstance(value, Mapping):
        entries: list[tuple[bytes, bytes]] = []
        for key, item in value.items():
            key_out: list[bytes] = []
            _encode(key, key_out, depth + 1)
            item_out: list[bytes] = []
            _encode(item, item_out, depth + 1)
            entries.append((b"".join(key_out), b"".join(item_out)))
        entries.sort(key=lambda e: e[0])
        for i in range(1, len(entries)):
            if entries[i][0] == entries[i - 1][0]:
                raise BadRequest("map has two keys with the same encoding")
        out.append(_head(_MT_MAP, len(entries)))
        for key_bytes, item_bytes in entries:
            out.append(key_bytes)
            out.append(item_bytes)
    else:
        raise BadRequest(f"{type(value).__name__} has no SDCP CBOR encoding")


def py_decode(data: bytes | bytearray | memoryview) -> Any:
    """:func:`decode` in Python."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise BadRequest("CBOR input must be bytes")
    buf = bytes(data)
    reader = _Reader(buf)
    value = reader.item(0)
    if reader.pos != len(buf):
        raise BadRequest(f"{len(buf) - reader.pos} bytes after the CBOR data item")
    return value


def py_decode_members(data: bytes, keys: list[str], max_items: int) -> dict[str, Any] | None:
    """:func:`decode_members` in Python: the whole item is built, then the members kept."""
    if not isinstance(data, bytes):
        raise BadRequest("CBOR input must be bytes")
    value = py_decode(data)
    if not isinstance(value, dict):
        return None
    kept = {k: value[k] for k in keys if k in value}
    built = sum(_items(v) for v in kept.values())
    if built > max_items:
        raise BadRequest(f"the record's members hold {built} data items; at most {max_items}")
    return kept


def _items(value: Any) -> int:
    """How many data items ``value`` is (itself, and everything it holds)."""
    if isinstance(value, list):
        return 1 + sum(_items(v) for v in value)
    if isinstance(value, dict):
        return 1 + sum(_items(k) + _items(v) for k, v in value.items())
    return 1


def py_all_uints(values: Any) -> bool:
    """:func:`all_uints` in Python (builtins over the whole list, no loop of ours)."""
    if not isinstance(values, (list, tuple)) or not all(type(x) is int for x in values):
        return False
    return not values or (min(values) >= 0 and max(values) <= UINT64_MAX)


def _py_item_at(buf: bytes, pos: int) -> tuple[Any, int]:
    """The item of a sequence that starts at ``pos``, and where the next one starts."""
    reader = _Reader(buf)
    reader.pos = pos
    return reader.item(0), reader.pos


class _Break:
    """Marker for the 0xFF stop code inside an indefinite-length item."""


_BREAK_MARK = _Break()


class _Reader:
    __slots__ = ("buf", "pos")

    def __init__(self, buf: bytes) -> None:
        self.buf = buf
        self.pos = 0

    def take(self, n: int) -> bytes:
        end = self.pos + n
        if end > len(self.buf):
            raise BadRequest("CBOR input ends inside a data item")
        chunk = self.buf[self.pos:end]
        self.pos = end
        return chunk

    def head(self) -> tuple[int, int, int | None]:
        """(major type, additional info, argument); argument None for indefinite length."""
        if self.pos >= len(self.buf):
            raise BadRequest("CBOR input ends before a data item")
        initial = self.buf[self.pos]
        self.pos += 1
        major, info = initial >> 5, initial & 0x1F
        if info < 24:
            return major, info, info
        if info <= 27:
            return major, info, int.from_bytes(self.take(1 << (info - 24)), "big")
        if info == 31:
            return major, info, None
        raise BadRequest(f"reserved additional information {info} in CBOR head")

    def length(self, arg: int, unit: int) -> int:
        # Each element needs at least ``unit`` more input bytes: refuse before allocating.
        if arg * unit > len(self.buf) - self.pos:
            raise BadRequest("CBOR length exceeds the input")
        return arg

    def item(self, depth: int) -> Any:
        value = self.item_or_break(depth)
        if value is _BREAK_MARK:
            raise BadRequest("CBOR break code outside an indefinite-length item")
        return value

    def item_or_break(self, depth: int) -> Any:
        if depth > MAX_DEPTH:
            raise BadRequest("CBOR nesting too deep")
        major, info, arg = self.head()
        if major == _MT_UINT or major == _MT_NINT:
            if arg is None:
                raise BadRequest("indefinite length on an integer")
            return arg if major == _MT_UINT else -1 - arg
        if major == _MT_BSTR or major == _MT_TSTR:
            raw = self.take(arg) if arg is not None else self.chunks(major)
            if major == _MT_BSTR:
                return raw
            try:
                return raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise BadRequest("CBOR text string is not valid UTF-8") from exc
        if major == _MT_ARRAY:
            if arg is not None:
                return self.array(self.length(arg, 1), depth)
            items: list[Any] = []
            while (value := self.item_or_break(depth + 1)) is not _BREAK_MARK:
                items.append(value)
            return items
        if major == _MT_MAP:
            result: dict[Any, Any] = {}
            if arg is not None:
                for _ in range(self.length(arg, 2)):
                    self.entry(result, self.item(depth + 1), depth)
            else:
                while (key := self.item_or_break(depth + 1)) is not _BREAK_MARK:
                    self.entry(result, key, depth)
            return result
        if major == _MT_TAG:
            raise BadRequest("CBOR tags are not used by SDCP")
        if info == 20:
            return False
        if info == 21:
            return True
        if info == 22:
            return None
        if info == 31:
            return _BREAK_MARK
        if 25 <= info <= 27:
            raise BadRequest("floating-point numbers are not used by SDCP")
        raise BadRequest(f"CBOR simple value {arg} is not used by SDCP")

    def array(self, count: int, depth: int) -> list[Any]:
        # Token lists dominate message size: read uint heads of up to 4 argument bytes inline.
        if count and depth >= MAX_DEPTH:
            raise BadRequest("CBOR nesting too deep")
        buf, end = self.buf, len(self.buf)
        items: list[Any] = []
        append = items.append
        for _ in range(count):
            pos = self.pos
            initial = buf[pos] if pos < end else 0xFF
            if initial < 24:
                append(initial)
                self.pos = pos + 1
            elif initial == 24 and pos + 2 <= end:
                append(buf[pos + 1])
                self.pos = pos + 2
            elif initial == 25 and pos + 3 <= end:
                append(buf[pos + 1] << 8 | buf[pos + 2])
                self.pos = pos + 3
            elif initial == 26 and pos + 5 <= end:
                append(int.from_bytes(buf[pos + 1:pos + 5], "big"))
                self.pos = pos + 5
            else:
                append(self.item(depth + 1))
        return items

    def entry(self, result: dict[Any, Any], key: Any, depth: int) -> None:
        if not isinstance(key, (int, str, bytes)) or isinstance(key, bool):
            raise BadRequest("CBOR map key must be an integer, text or byte string")
        if key in result:
            raise BadRequest(f"duplicate CBOR map key {key!r}")
        result[key] = self.item(depth + 1)

    def chunks(self, major: int) -> bytes:
        """An indefinite-length string: definite chunks of the same major type, then break."""
        parts: list[bytes] = []
        while True:
            if self.pos < len(self.buf) and self.buf[self.pos] == _BREAK:
                self.pos += 1
                return b"".join(parts)
            chunk_major, _, chunk_len = self.head()
            if chunk_major != major or chunk_len is None:
                raise BadRequest("bad chunk inside an indefinite-length string")
            chunk = self.take(chunk_len)
            if major == _MT_TSTR:
                try:
                    chunk.decode("utf-8")  # RFC 8949 §3.2.3: each chunk is valid UTF-8 on its own
                except UnicodeDecodeError as exc:
                    raise BadRequest("CBOR text chunk is not valid UTF-8") from exc
            parts.append(chunk)

