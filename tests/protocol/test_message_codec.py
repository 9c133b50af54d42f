"""The codec under every message: a member table drives checking, encoding and decoding."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from sdcp_fast.protocol import cbor
from sdcp_fast.protocol.message_codec import UINT, UINTS, Bstr, Message, Nested, Prompt, UInt, opt, req
from sdcp_fast.protocol.problems import BadContract, BadRequest


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
