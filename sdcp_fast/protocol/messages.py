"""Typed SDCP messages (draft §4.1 contract and sampling, §5.2 messages).

Field names are the CDDL map keys (``from`` is spelled ``from_``). Optional members
are ``None`` when absent, so that re-encoding reproduces what was received (the
contract digest depends on it). Lists are tuples; every class is frozen.

Each class declares its CDDL members once, in ``_members``; ``to_map``/``from_map``/
``encode``/``decode`` all read that table. Decoding checks every type, size and range
of the CDDL and reports :class:`BadRequest` (or :class:`BadContract` for anything inside
a contract). Unknown map keys are ignored except inside a contract (§5.2, §4.1).
"""

from __future__ import annotations

import base64
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, ClassVar, TypeVar

from sdcp_fast.protocol import cbor
from sdcp_fast.protocol.problems import BadContract, BadRequest, SdcpProblem


class Action(IntEnum):
    """Action registry of §4.1. Unknown values read as FAIL (§5.2)."""

    CONTINUE = 0
    REDUCE = 1
    SWITCH = 2
    SELF_DECODE = 3
    FINISH = 4
    FAIL = 5

    @classmethod
    def parse(cls, value: int) -> Action:
        try:
            return cls(value)
        except ValueError:
            return cls.FAIL


LADDER_ACTIONS = frozenset({Action.REDUCE, Action.SWITCH, Action.SELF_DECODE, Action.FAIL})

RULE_GREEDY = 1
RULE_SPECULATIVE = 2
REGISTERED_RULES = frozenset({RULE_GREEDY, RULE_SPECULATIVE})

ROLE_DRAFTER = 1
ROLE_VERIFIER = 2

MEDIA_TYPE = "application/sdcp+cbor"  # §5.1: every SDCP message body
_PATH_ID = re.compile(r"[A-Za-z0-9_-]{22}")


def session_path_id(session: bytes) -> str:
    """The ``{id}`` of session paths: base64url without padding of the 16-byte id (§5.1)."""
    if not isinstance(session, bytes) or len(session) != 16:
        raise BadRequest("session id must be 16 bytes")
    return base64.urlsafe_b64encode(session).rstrip(b"=").decode("ascii")


def parse_session_path_id(text: str) -> bytes:
    """The session id in a path's ``{id}``; :class:`BadRequest` unless it is exactly that form."""
    # 16 bytes are 22 characters; the last holds 2 bits, so only the canonical spelling is taken.
    if not isinstance(text, str) or not _PATH_ID.fullmatch(text):
        raise BadRequest("session path id must be 22 base64url characters")
    session = base64.urlsafe_b64decode(text + "==")  # cannot fail: the pattern admits only base64url
    if session_path_id(session) != text:
        raise BadRequest("session path id is not in canonical base64url form")
    return session


_INSTANCE_ID = re.compile(r"[A-Za-z0-9_-]+")


def instance_path_id(instance: str) -> str:
    """The ``{id}`` of ``instances/{id}/status`` (Table 1): base64url without padding of the
    UTF-8 instance name, the status message's ``instance`` (docs/interpretations.md). The
    draft defines ``{id}`` only for session paths; this spelling keeps any name, a base URI
    with its slashes included, one path segment."""
    if not isinstance(instance, str) or not instance:
        raise BadRequest("instance name must be non-empty text")
    try:
        raw = instance.encode("utf-8")
    except UnicodeEncodeError as exc:  # a lone surrogate
        raise BadRequest("instance name is not encodable as UTF-8") from exc
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def parse_instance_path_id(text: str) -> str:
    """The instance name in ``instances/{id}``; :class:`BadRequest` unless ``text`` is the
    canonical unpadded base64url of a non-empty UTF-8 name."""
    if not isinstance(text, str) or not _INSTANCE_ID.fullmatch(text) or len(text) % 4 == 1:
        raise BadRequest("instance path id must be unpadded base64url")
    raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    try:
        instance = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadRequest("instance path id does not hold UTF-8 text") from exc
    if instance_path_id(instance) != text:
        raise BadRequest("instance path id is not in canonical base64url form")
    return instance


_M = TypeVar("_M", bound="_Message")


class _Invalid(Exception):
    """A member's value breaks its CDDL type; the message turns it into its problem class."""


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class _Kind:
    """One CDDL type: ``parse`` checks a decoded value, ``dump`` checks a Python value."""

    def parse(self, raw: Any) -> Any:
        raise NotImplementedError

    def dump(self, value: Any) -> Any:
        return self.parse(value)


class _UInt(_Kind):
    def __init__(self, *, ge: int = 0, le: int = cbor.UINT64_MAX, only: frozenset[int] | None = None) -> None:
        self.ge, self.le, self.only = ge, le, only

    def parse(self, raw: Any) -> int:
        if not _is_int(raw) or not 0 <= raw <= cbor.UINT64_MAX:
            raise _Invalid("must be an unsigned integer below 2**64")
        if not self.ge <= raw <= self.le:
            raise _Invalid(f"must be in [{self.ge}, {self.le}], got {raw}")
        if self.only is not None and raw not in self.only:
            raise _Invalid(f"must be one of {sorted(self.only)}, got {raw}")
        return int(raw)


class _Bstr(_Kind):
    def __init__(self, size: int | None = None) -> None:
        self.size = size

    def parse(self, raw: Any) -> bytes:
        if not isinstance(raw, bytes):
            raise _Invalid("must be a byte string")
        if self.size is not None and len(raw) != self.size:
            raise _Invalid(f"must be {self.size} bytes, got {len(raw)}")
        return raw


class _Tstr(_Kind):
    def parse(self, raw: Any) -> str:
        if not isinstance(raw, str):
            raise _Invalid("must be a text string")
        return raw


class _Bool(_Kind):
    def parse(self, raw: Any) -> bool:
        if not isinstance(raw, bool):
            raise _Invalid("must be true or false")
        return raw


class _Array(_Kind):
    def __init__(self, item: _Kind, *, nonempty: bool = False) -> None:
        self.item, self.nonempty = item, nonempty

    def parse(self, raw: Any) -> tuple[Any, ...]:
        if not isinstance(raw, (list, tuple)):
            raise _Invalid("must be an array")
        if self.nonempty and not raw:
            raise _Invalid("must not be empty")
        if self.item is _UINT and all(type(x) is int for x in raw) and (
            not raw or (min(raw) >= 0 and max(raw) <= cbor.UINT64_MAX)
        ):
            return tuple(raw)  # token lists: the same check as _UINT's, done by builtins
        return tuple(self.item.parse(x) for x in raw)

    def dump(self, value: Any) -> list[Any]:
        return list(self.parse(value))


class _ActionKind(_Kind):
    """Any uint; values outside the registry read as FAIL (§5.2)."""

    def parse(self, raw: Any) -> Action:
        return Action.parse(_UINT.parse(raw))

    def dump(self, value: Any) -> int:
        return _UINT.parse(value)


class _LadderKind(_Kind):
    """A fallback entry: continue and finish are refused (§6.5.2); values the registry does not
    know are kept as received, so the digest covers them, and read as FAIL when applied."""

    def parse(self, raw: Any) -> int:
        value = _UINT.parse(raw)
        if value in (Action.CONTINUE, Action.FINISH):
            raise _Invalid(f"{Action(value).name.lower()} is not a ladder action")
        return value


class _Prompt(_Kind):
    """``[* uint] / cache-ref``."""

    def parse(self, raw: Any) -> tuple[int, ...] | str:
        if isinstance(raw, str):
            return raw
        if isinstance(raw, (list, tuple)):
            return _UINTS.parse(raw)
        raise _Invalid("must be an array of tokens or a cache reference")

    def dump(self, value: Any) -> list[int] | str:
        parsed = self.parse(value)
        return parsed if isinstance(parsed, str) else list(parsed)


class _Nested(_Kind):
    """A member that is itself a map; its own problem class unless the enclosing one overrides."""

    def __init__(self, cls: type[_Message], problem: type[SdcpProblem] | None = None,
                 strict: bool | None = None) -> None:
        self.cls = cls
        self.problem = problem or cls._problem
        self.strict = cls._strict if strict is None else strict

    def parse(self, raw: Any) -> Any:
        return self.cls._parse(raw, self.problem, self.strict)

    def dump(self, value: Any) -> dict[str, Any]:
        if not isinstance(value, self.cls):
            raise _Invalid(f"must be a {self.cls.__name__}")
        return value._dump(self.problem)


_UINT = _UInt()
_UINTS = _Array(_UINT)
_TSTR = _Tstr()
_HASH32 = _Bstr(32)
_SESSION_ID = _Bstr(16)
_PERCENT = _UInt(le=100)


@dataclass(frozen=True)
class _Member:
    attr: str
    kind: _Kind
    optional: bool = False
    key: str = ""

    @property
    def wire(self) -> str:
        return self.key or self.attr


def _req(attr: str, kind: _Kind, key: str = "") -> _Member:
    return _Member(attr, kind, False, key)


def _opt(attr: str, kind: _Kind) -> _Member:
    return _Member(attr, kind, True)


class _Message:
    """Codec shared by every message: the table in ``_members`` drives all four directions."""

    _members: ClassVar[tuple[_Member, ...]] = ()
    _problem: ClassVar[type[SdcpProblem]] = BadRequest
    _strict: ClassVar[bool] = False  # True: a key the draft does not define is an error

    def to_map(self) -> dict[str, Any]:
        """The CBOR map of this message (text keys, optional members left out when None)."""
        return self._dump(self._problem)

    def _dump(self, problem: type[SdcpProblem]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for member in self._members:
            value = getattr(self, member.attr)
            if value is None:
                if member.optional:
                    continue
                raise problem(f"{type(self).__name__}.{member.attr} is required")
            try:
                out[member.wire] = member.kind.dump(value)
            except _Invalid as exc:
                raise problem(f"{type(self).__name__}.{member.wire} {exc}") from None
        return out

    @classmethod
    def from_map(cls: type[_M], data: Any) -> _M:
        """The message in a decoded CBOR map; the class's problem for any violation."""
        return cls._parse(data, cls._problem, cls._strict)

    @classmethod
    def _parse(cls: type[_M], data: Any, problem: type[SdcpProblem], strict: bool) -> _M:
        name = cls.__name__
        if not isinstance(data, Mapping):
            raise problem(f"{name} must be a CBOR map")
        if strict:
            unknown = set(data) - {m.wire for m in cls._members}
            if unknown:
                raise problem(f"{name} has keys the draft does not define: {sorted(map(repr, unknown))}")
        values: dict[str, Any] = {}
        for member in cls._members:
            if member.wire not in data:
                if not member.optional:
                    raise problem(f"{name} lacks required key {member.wire!r}")
                continue
            try:
                values[member.attr] = member.kind.parse(data[member.wire])
            except _Invalid as exc:
                raise problem(f"{name}.{member.wire} {exc}") from None
        make: Callable[..., _M] = cls
        return make(**values)

    def encode(self) -> bytes:
        """Deterministic CBOR (RFC 8949 §4.2.1) of :meth:`to_map`."""
        return cbor.deterministic_cbor(self.to_map())

    @classmethod
    def decode(cls: type[_M], data: bytes) -> _M:
        """The message in ``data``; malformed CBOR is the class's problem too."""
        try:
            raw = cbor.decode(data)
        except BadRequest as exc:
            if cls._problem is BadRequest:
                raise
            raise cls._problem(exc.detail) from None
        return cls.from_map(raw)


@dataclass(frozen=True)
class Sampling(_Message):
    temperature_milli: int | None = None
    top_k: int | None = None
    top_p_milli: int | None = None
    seed: int | None = None

    _members = (
        _opt("temperature_milli", _UINT), _opt("top_k", _UINT), _opt("top_p_milli", _UInt(le=1000)),
        _opt("seed", _UINT),
    )


@dataclass(frozen=True)
class Contract(_Message):
    target: bytes
    tokenizer: bytes
    rule: int
    m_max: int
    max_new: int
    stop: tuple[int, ...]
    low_rounds: int
    fallback: tuple[int, ...]  # raw values as received; interpret with Action.parse
    drafters: tuple[bytes, ...] | None = None
    sampling: Sampling | None = None
    low_ratio: int | None = None
    self_load: int | None = None
    self_max: int | None = None
    scope: bytes | None = None

    _problem = BadContract
    _strict = True
    _members = (
        _req("target", _HASH32), _req("tokenizer", _HASH32),
        _opt("drafters", _Array(_HASH32, nonempty=True)),
        _req("rule", _UInt(only=REGISTERED_RULES)),
        _opt("sampling", _Nested(Sampling, BadContract, strict=True)),
        # m_max >= 1: §6.2 needs 1 <= M <= m_max, so m_max 0 admits no proposal.
        _req("m_max", _UInt(ge=1, le=64)), _req("max_new", _UINT), _req("stop", _UINTS),
        _req("low_rounds", _UInt(ge=1)), _opt("low_ratio", _PERCENT),
        _req("fallback", _Array(_LadderKind(), nonempty=True)),
        _opt("self_load", _PERCENT), _opt("self_max", _UINT), _opt("scope", _Bstr(16)),
    )


@dataclass(frozen=True)
class Resume(_Message):
    round: int
    committed: int
    digest: bytes
    committed_tokens: str
    target_kv: str | None = None

    _members = (
        _req("round", _UINT), _req("committed", _UINT), _req("digest", _HASH32),
        _req("committed_tokens", _TSTR), _opt("target_kv", _TSTR),
    )


@dataclass(frozen=True)
class SessionOpen(_Message):
    session: bytes
    epoch: int
    contract: Contract
    prompt: tuple[int, ...] | str  # tokens or an MLC cache-ref
    commit_log: str
    prompt_kv: str | None = None
    resume: Resume | None = None

    _members = (
        _req("session", _SESSION_ID), _req("epoch", _UINT), _req("contract", _Nested(Contract)),
        _req("prompt", _Prompt()), _opt("prompt_kv", _TSTR), _req("commit_log", _TSTR),
        _opt("resume", _Nested(Resume)),
    )


@dataclass(frozen=True)
class SessionState(_Message):
    session: bytes
    epoch: int
    round: int
    committed: int
    digest: bytes
    state: int | None = None

    _members = (
        _req("session", _SESSION_ID), _req("epoch", _UINT), _req("round", _UINT),
        _req("committed", _UINT), _req("digest", _HASH32), _opt("state", _UINT),
    )


@dataclass(frozen=True)
class Assignment(_Message):
    session: bytes
    epoch: int
    contract: Contract
    verifier: str
    drafter: str
    prompt: tuple[int, ...] | str
    round: int
    committed: int
    digest: bytes
    m_init: int
    sampling: Sampling | None = None
    committed_tokens: str | None = None

    _members = (
        _req("session", _SESSION_ID), _req("epoch", _UINT), _req("contract", _Nested(Contract)),
        _req("verifier", _TSTR), _req("drafter", _TSTR), _req("prompt", _Prompt()),
        _req("round", _UINT), _opt("sampling", _Nested(Sampling)),
        _req("committed", _UINT), _req("digest", _HASH32), _opt("committed_tokens", _TSTR),
        # m_init >= 1: it stands in for m_cap before the first verdict (§6.2, §6.5.1).
        _req("m_init", _UInt(ge=1)),
    )


@dataclass(frozen=True)
class Status(_Message):
    instance: str
    role: int
    load: int
    queue: int
    ttl_ms: int
    accept_milli: int | None = None
    cache_mbps: int | None = None

    _members = (
        _req("instance", _TSTR), _req("role", _UInt(only=frozenset({ROLE_DRAFTER, ROLE_VERIFIER}))),
        _req("load", _PERCENT), _req("queue", _UINT), _opt("accept_milli", _UInt(le=1000)),
        _opt("cache_mbps", _UINT), _req("ttl_ms", _UINT),
    )


@dataclass(frozen=True)
class Proposal(_Message):
    session: bytes
    epoch: int
    round: int
    drafter: str
    base: int
    base_digest: bytes
    tokens: tuple[int, ...]
    status: Status
    q_rows: str | None = None
    draft_kv: str | None = None

    _members = (
        _req("session", _SESSION_ID), _req("epoch", _UINT), _req("round", _UINT),
        _req("drafter", _TSTR), _req("base", _UINT), _req("base_digest", _HASH32),
        _req("tokens", _Array(_UINT, nonempty=True)), _opt("q_rows", _TSTR), _opt("draft_kv", _TSTR),
        _req("status", _Nested(Status)),
    )


@dataclass(frozen=True)
class Verdict(_Message):
    session: bytes
    epoch: int
    round: int
    accepted: int
    emitted: tuple[int, ...]
    committed: int
    digest: bytes
    action: Action
    m_cap: int
    low: int
    load: int

    _members = (
        _req("session", _SESSION_ID), _req("epoch", _UINT), _req("round", _UINT),
        _req("accepted", _UINT), _req("emitted", _UINTS), _req("committed", _UINT),
        _req("digest", _HASH32), _req("action", _ActionKind()),
        # m_cap >= 1: §6.5.1 "1 <= m_cap <= m_max".
        _req("m_cap", _UInt(ge=1)), _req("low", _UINT), _req("load", _PERCENT),
    )


@dataclass(frozen=True)
class Output(_Message):
    session: bytes
    epoch: int
    from_: int
    tokens: tuple[int, ...]
    final: bool
    finish: Action | None = None

    _members = (
        _req("session", _SESSION_ID), _req("epoch", _UINT), _req("from_", _UINT, key="from"),
        _req("tokens", _UINTS), _req("final", _Bool()), _opt("finish", _ActionKind()),
    )


@dataclass(frozen=True)
class Event(_Message):
    session: bytes
    epoch: int
    kind: Action
    committed: int
    digest: bytes

    _members = (
        _req("session", _SESSION_ID), _req("epoch", _UINT), _req("kind", _ActionKind()),
        _req("committed", _UINT), _req("digest", _HASH32),
    )


@dataclass(frozen=True)
class Policy(_Message):
    session: bytes
    from_round: int
    sampling: Sampling

    _members = (
        _req("session", _SESSION_ID), _req("from_round", _UINT), _req("sampling", _Nested(Sampling)),
    )
