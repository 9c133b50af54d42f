"""Typed SDCP messages (draft §4.1 contract and sampling, §5.2 messages).

Field names are the CDDL map keys (``from`` is spelled ``from_``). Optional members
are ``None`` when absent, so that re-encoding reproduces what was received (the
contract digest depends on it). Lists are tuples; every class is frozen.

Each class declares its CDDL members once, in ``_members``; ``to_map``/``from_map``/
``encode``/``decode`` all read that table (the codec and the CDDL types are in
:mod:`sdcp_fast.protocol.message_codec`). Decoding checks every type, size and range
of the CDDL and reports :class:`BadRequest` (or :class:`BadContract` for anything inside
a contract). Unknown map keys are ignored except inside a contract (§5.2, §4.1).
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

from sdcp_fast.protocol.message_codec import (
    HASH32,
    PERCENT,
    SESSION_ID,
    TSTR,
    UINT,
    UINTS,
    Array,
    Bool,
    Bstr,
    Invalid,
    Kind,
    Message,
    Nested,
    Prompt,
    UInt,
    opt,
    req,
)
from sdcp_fast.protocol.problems import BadContract, BadRequest


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


class _ActionKind(Kind):
    """Any uint; values outside the registry read as FAIL (§5.2)."""

    def parse(self, raw: Any) -> Action:
        return Action.parse(UINT.parse(raw))

    def dump(self, value: Any) -> int:
        return UINT.parse(value)


class _LadderKind(Kind):
    """A fallback entry: continue and finish are refused (§6.5.2); values the registry does not
    know are kept as received, so the digest covers them, and read as FAIL when applied."""

    def parse(self, raw: Any) -> int:
        value = UINT.parse(raw)
        if value in (Action.CONTINUE, Action.FINISH):
            raise Invalid(f"{Action(value).name.lower()} is not a ladder action")
        return value


@dataclass(frozen=True)
class Sampling(Message):
    temperature_milli: int | None = None
    top_k: int | None = None
    top_p_milli: int | None = None
    seed: int | None = None

    _members = (
        opt("temperature_milli", UINT), opt("top_k", UINT), opt("top_p_milli", UInt(le=1000)),
        opt("seed", UINT),
    )


@dataclass(frozen=True)
class Contract(Message):
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
        req("target", HASH32), req("tokenizer", HASH32),
        opt("drafters", Array(HASH32, nonempty=True)),
        req("rule", UInt(only=REGISTERED_RULES)),
        opt("sampling", Nested(Sampling, BadContract, strict=True)),
        # m_max >= 1: §6.2 needs 1 <= M <= m_max, so m_max 0 admits no proposal.
        req("m_max", UInt(ge=1, le=64)), req("max_new", UINT), req("stop", UINTS),
        req("low_rounds", UInt(ge=1)), opt("low_ratio", PERCENT),
        req("fallback", Array(_LadderKind(), nonempty=True)),
        opt("self_load", PERCENT), opt("self_max", UINT), opt("scope", Bstr(16)),
    )


@dataclass(frozen=True)
class Resume(Message):
    round: int
    committed: int
    digest: bytes
    committed_tokens: str
    target_kv: str | None = None

    _members = (
        req("round", UINT), req("committed", UINT), req("digest", HASH32),
        req("committed_tokens", TSTR), opt("target_kv", TSTR),
    )


@dataclass(frozen=True)
class SessionOpen(Message):
    session: bytes
    epoch: int
    contract: Contract
    prompt: tuple[int, ...] | str  # tokens or an MLC cache-ref
    commit_log: str
    prompt_kv: str | None = None
    resume: Resume | None = None

    _members = (
        req("session", SESSION_ID), req("epoch", UINT), req("contract", Nested(Contract)),
        req("prompt", Prompt()), opt("prompt_kv", TSTR), req("commit_log", TSTR),
        opt("resume", Nested(Resume)),
    )


@dataclass(frozen=True)
class SessionState(Message):
    session: bytes
    epoch: int
    round: int
    committed: int
    digest: bytes
    state: int | None = None

    _members = (
        req("session", SESSION_ID), req("epoch", UINT), req("round", UINT),
        req("committed", UINT), req("digest", HASH32), opt("state", UINT),
    )


@dataclass(frozen=True)
class Assignment(Message):
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
        req("session", SESSION_ID), req("epoch", UINT), req("contract", Nested(Contract)),
        req("verifier", TSTR), req("drafter", TSTR), req("prompt", Prompt()),
        req("round", UINT), opt("sampling", Nested(Sampling)),
        req("committed", UINT), req("digest", HASH32), opt("committed_tokens", TSTR),
        # m_init >= 1: it stands in for m_cap before the first verdict (§6.2, §6.5.1).
        req("m_init", UInt(ge=1)),
    )


@dataclass(frozen=True)
class Status(Message):
    instance: str
    role: int
    load: int
    queue: int
    ttl_ms: int
    accept_milli: int | None = None
    cache_mbps: int | None = None

    _members = (
        req("instance", TSTR), req("role", UInt(only=frozenset({ROLE_DRAFTER, ROLE_VERIFIER}))),
        req("load", PERCENT), req("queue", UINT), opt("accept_milli", UInt(le=1000)),
        opt("cache_mbps", UINT), req("ttl_ms", UINT),
    )


@dataclass(frozen=True)
class Proposal(Message):
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
        req("session", SESSION_ID), req("epoch", UINT), req("round", UINT),
        req("drafter", TSTR), req("base", UINT), req("base_digest", HASH32),
        req("tokens", Array(UINT, nonempty=True)), opt("q_rows", TSTR), opt("draft_kv", TSTR),
        req("status", Nested(Status)),
    )


@dataclass(frozen=True)
class Verdict(Message):
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
        req("session", SESSION_ID), req("epoch", UINT), req("round", UINT),
        req("accepted", UINT), req("emitted", UINTS), req("committed", UINT),
        req("digest", HASH32), req("action", _ActionKind()),
        # m_cap >= 1: §6.5.1 "1 <= m_cap <= m_max".
        req("m_cap", UInt(ge=1)), req("low", UINT), req("load", PERCENT),
    )


@dataclass(frozen=True)
class Output(Message):
    session: bytes
    epoch: int
    from_: int
    tokens: tuple[int, ...]
    final: bool
    finish: Action | None = None

    _members = (
        req("session", SESSION_ID), req("epoch", UINT), req("from_", UINT, key="from"),
        req("tokens", UINTS), req("final", Bool()), opt("finish", _ActionKind()),
    )


@dataclass(frozen=True)
class Event(Message):
    session: bytes
    epoch: int
    kind: Action
    committed: int
    digest: bytes

    _members = (
        req("session", SESSION_ID), req("epoch", UINT), req("kind", _ActionKind()),
        req("committed", UINT), req("digest", HASH32),
    )


@dataclass(frozen=True)
class Policy(Message):
    session: bytes
    from_round: int
    sampling: Sampling

    _members = (
        req("session", SESSION_ID), req("from_round", UINT), req("sampling", Nested(Sampling)),
    )
