"""Typed SDCP messages (draft §4.1 contract and sampling, §5.2 messages).

Field names are the CDDL map keys (``from`` is spelled ``from_``). Optional members
are ``None`` when absent, so that re-encoding reproduces what was received (the
contract digest depends on it). Lists are tuples; every class is frozen.

TODO(protocol-codec): encode()/decode()/to_map()/from_map() with full validation.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum


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


@dataclass(frozen=True)
class Sampling:
    temperature_milli: int | None = None
    top_k: int | None = None
    top_p_milli: int | None = None
    seed: int | None = None


@dataclass(frozen=True)
class Contract:
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


@dataclass(frozen=True)
class Resume:
    round: int
    committed: int
    digest: bytes
    committed_tokens: str
    target_kv: str | None = None


@dataclass(frozen=True)
class SessionOpen:
    session: bytes
    epoch: int
    contract: Contract
    prompt: tuple[int, ...] | str  # tokens or an MLC cache-ref
    commit_log: str
    prompt_kv: str | None = None
    resume: Resume | None = None


@dataclass(frozen=True)
class SessionState:
    session: bytes
    epoch: int
    round: int
    committed: int
    digest: bytes
    state: int | None = None


@dataclass(frozen=True)
class Assignment:
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


@dataclass(frozen=True)
class Status:
    instance: str
    role: int
    load: int
    queue: int
    ttl_ms: int
    accept_milli: int | None = None
    cache_mbps: int | None = None


@dataclass(frozen=True)
class Proposal:
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


@dataclass(frozen=True)
class Verdict:
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


@dataclass(frozen=True)
class Output:
    session: bytes
    epoch: int
    from_: int
    tokens: tuple[int, ...]
    final: bool
    finish: Action | None = None


@dataclass(frozen=True)
class Event:
    session: bytes
    epoch: int
    kind: Action
    committed: int
    digest: bytes


@dataclass(frozen=True)
class Policy:
    session: bytes
    from_round: int
    sampling: Sampling
