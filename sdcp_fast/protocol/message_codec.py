"""The CDDL codec every SDCP message is built on (draft §5.2, §4.1).

A message class lists its members once, as a table of :class:`Member` (wire key, CDDL
type, optional or not); :class:`Message` reads that table to check, encode and decode in
all four directions, and turns a member that breaks its type into the class's problem.
The CDDL types are small :class:`Kind` objects: each checks a decoded value (``parse``)
and a Python value before encoding (``dump``). The messages themselves are in
:mod:`sdcp_fast.protocol.messages`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

from sdcp_fast.protocol import cbor
from sdcp_fast.protocol.problems import BadRequest, SdcpProblem

_M = TypeVar("_M", bound="Message")


class Invalid(Exception):
    """A member's value breaks its CDDL type; the message turns it into its problem class."""


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class Kind:
    """One CDDL type: ``parse`` checks a decoded value, ``dump`` checks a Python value."""

    def parse(self, raw: Any) -> Any:
        raise NotImplementedError

    def dump(self, value: Any) -> Any:
        return self.parse(value)


class UInt(Kind):
    def __init__(self, *, ge: int = 0, le: int = cbor.UINT64_MAX, only: frozenset[int] | None = None) -> None:
        self.ge, self.le, self.only = ge, le, only
        self._lo, self._hi = max(ge, 0), min(le, cbor.UINT64_MAX)  # both bounds at once

    def parse(self, raw: Any) -> int:
        # Every message holds several: a plain int in range passes in one test.
        if type(raw) is int and self._lo <= raw <= self._hi and (self.only is None or raw in self.only):
            return raw
        if not is_int(raw) or not 0 <= raw <= cbor.UINT64_MAX:
            raise Invalid("must be an unsigned integer below 2**64")
        if not self.ge <= raw <= self.le:
            raise Invalid(f"must be in [{self.ge}, {self.le}], got {raw}")
        if self.only is not None and raw not in self.only:
            raise Invalid(f"must be one of {sorted(self.only)}, got {raw}")
        return int(raw)


class Bstr(Kind):
    def __init__(self, size: int | None = None) -> None:
        self.size = size

    def parse(self, raw: Any) -> bytes:
        if not isinstance(raw, bytes):
            raise Invalid("must be a byte string")
        if self.size is not None and len(raw) != self.size:
            raise Invalid(f"must be {self.size} bytes, got {len(raw)}")
        return raw


class Tstr(Kind):
    def parse(self, raw: Any) -> str:
        if not isinstance(raw, str):
            raise Invalid("must be a text string")
        return raw


class Bool(Kind):
    def parse(self, raw: Any) -> bool:
        if not isinstance(raw, bool):
            raise Invalid("must be true or false")
        return raw


class Array(Kind):
    def __init__(self, item: Kind, *, nonempty: bool = False) -> None:
        self.item, self.nonempty = item, nonempty

    def parse(self, raw: Any) -> tuple[Any, ...]:
        if not isinstance(raw, (list, tuple)):
            raise Invalid("must be an array")
        if self.nonempty and not raw:
            raise Invalid("must not be empty")
        if self.item is UINT and cbor.all_uints(raw):
            return tuple(raw)  # token lists: the same check as UINT's, in one call
        return tuple(self.item.parse(x) for x in raw)

    def dump(self, value: Any) -> list[Any]:
        return list(self.parse(value))


class Prompt(Kind):
    """``[* uint] / cache-ref``."""

    def parse(self, raw: Any) -> tuple[int, ...] | str:
        if isinstance(raw, str):
            return raw
        if isinstance(raw, (list, tuple)):
            return UINTS.parse(raw)
        raise Invalid("must be an array of tokens or a cache reference")

    def dump(self, value: Any) -> list[int] | str:
        parsed = self.parse(value)
        return parsed if isinstance(parsed, str) else list(parsed)


class Nested(Kind):
    """A member that is itself a map; its own problem class unless the enclosing one overrides."""

    def __init__(self, cls: type[Message], problem: type[SdcpProblem] | None = None,
                 strict: bool | None = None) -> None:
        self.cls = cls
        self.problem = problem or cls._problem
        self.strict = cls._strict if strict is None else strict

    def parse(self, raw: Any) -> Any:
        return self.cls._parse(raw, self.problem, self.strict)

    def dump(self, value: Any) -> dict[str, Any]:
        if not isinstance(value, self.cls):
            raise Invalid(f"must be a {self.cls.__name__}")
        return value._dump(self.problem)


UINT = UInt()
UINTS = Array(UINT)
TSTR = Tstr()
HASH32 = Bstr(32)
SESSION_ID = Bstr(16)
PERCENT = UInt(le=100)


@dataclass(frozen=True)
class Member:
    attr: str
    kind: Kind
    optional: bool = False
    key: str = ""
    wire: str = field(init=False, repr=False, compare=False)  # the key on the wire

    def __post_init__(self) -> None:
        object.__setattr__(self, "wire", self.key or self.attr)


def req(attr: str, kind: Kind, key: str = "") -> Member:
    return Member(attr, kind, False, key)


def opt(attr: str, kind: Kind) -> Member:
    return Member(attr, kind, True)


_ABSENT = object()


_WIRES: dict[type[Message], frozenset[str]] = {}


def _wires(cls: type[Message]) -> frozenset[str]:
    """The keys ``cls`` defines, worked out once per class."""
    wires = _WIRES.get(cls)
    if wires is None:
        wires = _WIRES[cls] = frozenset(m.wire for m in cls._members)
    return wires


# -- the unchecked-looking path ---------------------------------------------------------------
# Walking the table costs a method call or two per member, and the verifier reads a proposal
# and writes a verdict and an output every round. So each class also gets one function per
# direction, generated from its table, that tests each member inline. It takes only values
# that plainly pass (an int of the exact type in range, bytes of the size, ...) and answers
# None for anything else; the table walk then runs from the start, so every error, and any
# value only the walk accepts, comes out exactly as before.

_Dumper = Callable[[Any], "dict[str, Any] | None"]
_Parser = Callable[[Any, bool], Any]
_FAST: dict[type, tuple[_Dumper, _Parser] | None] = {}


def _test(kind: Kind, v: str, name: str, env: dict[str, Any], parse: bool) -> tuple[str, str] | None:
    """An expression true when the value ``v`` plainly passes ``kind``, and the value to keep."""
    if isinstance(kind, UInt) and type(kind) is UInt:
        only = ""
        if kind.only is not None:
            env[name + "_only"] = kind.only
            only = f" and {v} in {name}_only"
        return f"type({v}) is int and {kind._lo} <= {v} <= {kind._hi}{only}", v
    if type(kind) is Bstr:
        size = "" if kind.size is None else f" and len({v}) == {kind.size}"
        return f"type({v}) is bytes{size}", v
    if type(kind) is Tstr:
        return f"type({v}) is str", v
    if type(kind) is Bool:
        return f"({v} is True or {v} is False)", v
    if type(kind) is Array and kind.item is UINT:
        nonempty = f" and {v}" if kind.nonempty else ""
        return (f"type({v}) is {'list' if parse else 'tuple'}{nonempty} and _all_uints({v})",
                f"tuple({v})" if parse else f"list({v})")
    return None


def _compile(cls: type[Message]) -> tuple[_Dumper, _Parser] | None:
    if not dataclasses.is_dataclass(cls):
        return None
    fields = {f.name: f for f in dataclasses.fields(cls)}
    env: dict[str, Any] = {"_all_uints": cbor.all_uints, "_ABSENT": _ABSENT, "_Invalid": Invalid,
                           "_cls": cls, "_wires": _wires(cls), "_fast": _fast}
    dump = ["def dump(self):", "    out = {}"]
    parse = ["def parse(data, strict):", "    if type(data) is not dict: return None",
             "    if strict and not data.keys() <= _wires: return None", "    get = data.get"]
    args = []
    for i, member in enumerate(cls._members):
        field_ = fields.get(member.attr)
        if field_ is None or not field_.init or (member.optional and field_.default is not None):
            return None  # an absent optional member must read as None, as the walk leaves it
        kind, name, wire = member.kind, f"k{i}", repr(member.wire)
        env[name] = kind
        dump.append(f"    v = self.{member.attr}")
        parse.append(f"    v = get({wire}, _ABSENT)")
        skip_d = "    if v is not None:" if member.optional else "    if v is None: return None\n    if True:"
        skip_p = (f"    if v is _ABSENT: a{i} = None\n    else:" if member.optional
                  else "    if v is _ABSENT: return None\n    if True:")
        dump.append(skip_d)
        parse.append(skip_p)
        if isinstance(kind, Nested):
            env[name + "_cls"], env[name + "_p"], env[name + "_s"] = kind.cls, kind.problem, kind.strict
            dump += [f"        if type(v) is not {name}_cls: return None",
                     "        d = _fast(type(v))",
                     "        d = None if d is None else d[0](v)",
                     "        if d is None: return None",
                     f"        out[{wire}] = d"]
            # The nested class checks itself, problems and all, as the walk would call it.
            parse.append(f"        a{i} = {name}_cls._parse(v, {name}_p, {name}_s)")
        else:
            d_test, p_test = _test(kind, "v", name, env, False), _test(kind, "v", name, env, True)
            if d_test is None or p_test is None:
                dump += ["        try:", f"            out[{wire}] = {name}.dump(v)",
                         "        except _Invalid: return None"]
                parse += ["        try:", f"            a{i} = {name}.parse(v)",
                          "        except _Invalid: return None"]
            else:
                dump += [f"        if not ({d_test[0]}): return None", f"        out[{wire}] = {d_test[1]}"]
                parse += [f"        if not ({p_test[0]}): return None", f"        a{i} = {p_test[1]}"]
        args.append(f"{member.attr}=a{i}")
    dump.append("    return out")
    if set(fields) == {m.attr for m in cls._members} and not hasattr(cls, "__post_init__"):
        # What the frozen dataclass's __init__ would do, one attribute at a time.
        env["_new"] = object.__new__
        parse += ["    o = _new(_cls)", f"    o.__dict__.update({', '.join(args)})", "    return o"]
    else:
        parse.append(f"    return _cls({', '.join(args)})")
    exec("\n".join(dump) + "\n" + "\n".join(parse), env)  # noqa: S102 - source built above from the table
    return env["dump"], env["parse"]


def _fast(cls: type[Message]) -> tuple[_Dumper, _Parser] | None:
    """``cls``'s generated pair, compiled at its first use (None: the class has none)."""
    try:
        return _FAST[cls]
    except KeyError:
        fast = _FAST[cls] = _compile(cls)
        return fast


# -- the native pair ------------------------------------------------------------------------------
# The same "plainly valid or None" pair in C (csrc/cbor/), driven by the same tables, for the
# messages of every round: encode writes the attributes straight to deterministic CBOR, decode
# reads the bytes straight into the message, with no map built in between. It runs while the
# native CBOR codec is the one chosen, for the classes the generated pair takes; a None from it
# runs the Python path from the start.

_K_UINT, _K_BSTR, _K_TSTR, _K_BOOL, _K_UINTS, _K_NESTED, _K_OTHER = range(7)
_NATIVE: dict[type, Any] = {}


def _native_member(member: Member) -> tuple[Any, ...] | None:
    """``member`` as the native codec's compile_message takes it (None: no codec for its class)."""
    kind = member.kind
    lo, hi, only, size, nonempty, nested, strict = 0, cbor.UINT64_MAX, None, -1, False, None, False
    if isinstance(kind, UInt) and type(kind) is UInt and kind._lo <= kind._hi:
        code, lo, hi = _K_UINT, kind._lo, kind._hi
        if kind.only is not None:  # ``in`` compares by value: True stands for 1
            only = sorted({int(x) for x in kind.only if isinstance(x, int) and 0 <= x <= cbor.UINT64_MAX})
    elif type(kind) is Bstr:
        code, size = _K_BSTR, -1 if kind.size is None else kind.size
    elif type(kind) is Tstr:
        code = _K_TSTR
    elif type(kind) is Bool:
        code = _K_BOOL
    elif type(kind) is Array and kind.item is UINT:
        code, nonempty = _K_UINTS, kind.nonempty
    elif isinstance(kind, Nested):
        code, nested, strict = _K_NESTED, _native(kind.cls), kind.strict
        if nested is None:
            return None
    else:
        code = _K_OTHER  # the kind's own parse and dump, called from C
    return (member.attr, member.wire, code, member.optional, lo, hi, only, size, nonempty, nested, strict, kind)


def _native(cls: type[Message]) -> Any:
    """``cls``'s compiled native codec, made at its first use (None: the class has none)."""
    try:
        return _NATIVE[cls]
    except KeyError:
        pass
    codec = None
    mod = cbor.native_messages()
    if mod is not None and _fast(cls) is not None and len(cls._members) <= 23:
        members = [_native_member(m) for m in cls._members]
        fields = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        make_new = fields == {m.attr for m in cls._members} and not hasattr(cls, "__post_init__")
        if all(m is not None for m in members):
            codec = mod.compile_message(cls, cls._strict, make_new, members)
    if mod is not None:  # compiled against the native module; tried again once it is chosen
        _NATIVE[cls] = codec
    return codec


class Message:
    """Codec shared by every message: the table in ``_members`` drives all four directions."""

    _members: ClassVar[tuple[Member, ...]] = ()
    _problem: ClassVar[type[SdcpProblem]] = BadRequest
    _strict: ClassVar[bool] = False  # True: a key the draft does not define is an error

    def to_map(self) -> dict[str, Any]:
        """The CBOR map of this message (text keys, optional members left out when None)."""
        return self._dump(self._problem)

    def _dump(self, problem: type[SdcpProblem]) -> dict[str, Any]:
        fast = _fast(type(self))
        if fast is not None:
            done = fast[0](self)
            if done is not None:
                return done
        out: dict[str, Any] = {}
        for member in self._members:
            value = getattr(self, member.attr)
            if value is None:
                if member.optional:
                    continue
                raise problem(f"{type(self).__name__}.{member.attr} is required")
            try:
                out[member.wire] = member.kind.dump(value)
            except Invalid as exc:
                raise problem(f"{type(self).__name__}.{member.wire} {exc}") from None
        return out

    @classmethod
    def from_map(cls: type[_M], data: Any) -> _M:
        """The message in a decoded CBOR map; the class's problem for any violation."""
        return cls._parse(data, cls._problem, cls._strict)

    @classmethod
    def _parse(cls: type[_M], data: Any, problem: type[SdcpProblem], strict: bool) -> _M:
        fast = _fast(cls)
        if fast is not None:
            done: _M | None = fast[1](data, strict)
            if done is not None:
                return done
        name = cls.__name__
        if not isinstance(data, Mapping):
            raise problem(f"{name} must be a CBOR map")
        if strict:
            unknown = set(data) - _wires(cls)
            if unknown:
                raise problem(f"{name} has keys the draft does not define: {sorted(map(repr, unknown))}")
        values: dict[str, Any] = {}
        for member in cls._members:
            wire = member.wire
            raw = data.get(wire, _ABSENT)
            if raw is _ABSENT:
                if not member.optional:
                    raise problem(f"{name} lacks required key {wire!r}")
                continue
            try:
                values[member.attr] = member.kind.parse(raw)
            except Invalid as exc:
                raise problem(f"{name}.{wire} {exc}") from None
        make: Callable[..., _M] = cls
        return make(**values)

    def encode(self) -> bytes:
        """Deterministic CBOR (RFC 8949 §4.2.1) of :meth:`to_map`."""
        mod = cbor.native_messages()
        if mod is not None:
            codec = _native(type(self))
            if codec is not None:
                done: bytes | None = mod.dump_message(codec, self)
                if done is not None:
                    return done
        return cbor.deterministic_cbor(self.to_map())

    @classmethod
    def decode(cls: type[_M], data: bytes) -> _M:
        """The message in ``data``; malformed CBOR is the class's problem too."""
        mod = cbor.native_messages()
        if mod is not None:
            codec = _native(cls)
            if codec is not None:
                done: _M | None = mod.parse_message(codec, data)
                if done is not None:
                    return done
        try:
            raw = cbor.decode(data)
        except BadRequest as exc:
            if cls._problem is BadRequest:
                raise
            raise cls._problem(exc.detail) from None
        return cls.from_map(raw)
