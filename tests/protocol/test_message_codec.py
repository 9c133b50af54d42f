"""The codec under every message: a member table drives checking, encoding and decoding."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sdcp_fast.protocol import cbor, message_codec
from sdcp_fast.protocol.message_codec import UINT, UINTS, Bstr, Message, Nested, Prompt, UInt, opt, req
from sdcp_fast.protocol.messages import Output, Proposal, Verdict
from sdcp_fast.protocol.problems import BadContract, BadRequest, SdcpProblem
from tests.protocol.message_strategies import BY_CLASS, EXAMPLES


@dataclass(frozen=True)
class Inner(Message):
    n: int | None = None
    _members = (req("n", UInt(le=9)),)
    _problem = BadContract
    _strict = True


@dataclass(frozen=True)
class Outer(Message):
    tokens: tuple[int, ...] = ()
    from_: bytes | None = None
    prompt: tuple[int, ...] | str | None = None
    inner: Inner | None = None
    _members = (req("tokens", UINTS), req("from_", Bstr(2), key="from"), opt("prompt", Prompt()),
                opt("inner", Nested(Inner)))


def test_the_table_drives_both_directions_and_leaves_absent_optionals_out() -> None:
    msg = Outer(tokens=(1, 2), from_=b"ab", inner=Inner(3))
    assert msg.to_map() == {"tokens": [1, 2], "from": b"ab", "inner": {"n": 3}}
    assert Outer.decode(msg.encode()) == msg
    assert Outer.decode(cbor.deterministic_cbor({"tokens": [], "from": b"ab", "prompt": "ref"})).prompt == "ref"


@pytest.mark.parametrize("data", [
    {"from": b"ab"},                                  # required member missing
    {"tokens": [1, -1], "from": b"ab"},               # the token fast path still checks the range
    {"tokens": [2**64], "from": b"ab"},
    {"tokens": [True], "from": b"ab"},                # a bool is no integer
    {"tokens": [], "from": b"abc"},                   # wrong size
    {"tokens": [], "from": b"ab", "prompt": 5},
    [1, 2],                                           # not a map
])
def test_a_member_that_breaks_its_type_is_the_class_problem(data: object) -> None:
    with pytest.raises(BadRequest):
        Outer.from_map(data)


def test_a_nested_member_keeps_its_own_problem_and_strictness() -> None:
    with pytest.raises(BadContract):
        Outer.from_map({"tokens": [], "from": b"ab", "inner": {"n": 10}})
    with pytest.raises(BadContract, match="keys the draft does not define"):
        Outer.from_map({"tokens": [], "from": b"ab", "inner": {"n": 1, "x": 0}})
    assert Outer.from_map({"tokens": [], "from": b"ab", "x": 0}).tokens == ()  # the outer one ignores them


def test_encoding_checks_values_too() -> None:
    with pytest.raises(BadRequest, match="required"):
        Outer(tokens=(1,)).encode()
    with pytest.raises(BadRequest):
        Outer(tokens=(1,), from_=b"ab", inner=3).encode()  # type: ignore[arg-type]
    assert UINT.dump(7) == 7


# -- the generated per-class pair against the table walk ---------------------------------------

ODD = [None, -1, 0, 7, 2**64, True, False, 1.5, "x", "", b"", b"x" * 16, b"y" * 32, [], [1, 2], [True], [-1],
       (3,), {}, {"n": 1}]


def _outcome(call: Any) -> tuple[str, Any]:
    try:
        return "ok", call()
    except SdcpProblem as exc:
        return type(exc).__name__, exc.detail


def _walked(call: Any) -> tuple[str, Any]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(message_codec, "_fast", lambda cls: None)
        return _outcome(call)


@pytest.mark.parametrize(("cls", "strategy", "rule"), BY_CLASS, ids=[c.__name__ for c, _, _ in BY_CLASS])
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_the_generated_pair_answers_as_the_table_walk(
    cls: type[Any], strategy: st.SearchStrategy[Any], rule: str | None, data: st.DataObject
) -> None:
    msg = data.draw(strategy)
    raw = msg.to_map()
    assert message_codec._fast(cls) is not None
    assert _walked(msg.to_map) == ("ok", raw)
    # One member broken, dropped or added, here or one map down.
    target = raw
    nested = [k for k, v in raw.items() if isinstance(v, dict)]
    if nested and data.draw(st.booleans()):
        target = raw[data.draw(st.sampled_from(nested))]
    key = data.draw(st.sampled_from([*target, "unknown"]))
    if data.draw(st.booleans()) and key in target:
        del target[key]
    else:
        target[key] = data.draw(st.sampled_from(ODD))
    assert _outcome(lambda: cls.from_map(raw)) == _walked(lambda: cls.from_map(raw))


@pytest.mark.parametrize("value", ODD)
def test_encoding_a_broken_member_answers_as_the_table_walk(value: object) -> None:
    for cls in (Proposal, Verdict, Output, Inner, Outer):
        base = EXAMPLES.get(cls) or (Outer(tokens=(1,), from_=b"ab", inner=Inner(3)) if cls is Outer else Inner(3))
        for member in cls._members:
            broken = dataclasses.replace(base, **{member.attr: value})
            assert _outcome(broken.to_map) == _walked(broken.to_map)


def test_a_class_the_generator_cannot_follow_keeps_the_table_walk() -> None:
    @dataclass(frozen=True)
    class Defaulted(Message):
        n: int | None = 3  # absent must read as 3, not None
        _members = (opt("n", UINT),)

    class Plain(Message):
        _members = (req("n", UINT),)

    assert message_codec._fast(Defaulted) is None and message_codec._fast(Plain) is None
    assert Defaulted.from_map({}) == Defaulted(3)
