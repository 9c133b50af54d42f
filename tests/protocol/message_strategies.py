"""Hypothesis strategies for valid SDCP messages, shared by the protocol tests."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from sdcp_fast.protocol.messages import (
    Action,
    Assignment,
    Contract,
    Event,
    Output,
    Policy,
    Proposal,
    Resume,
    Sampling,
    SessionOpen,
    SessionState,
    Status,
    Verdict,
)

U64 = st.one_of(st.integers(0, 300), st.integers(0, (1 << 64) - 1))
TOKENS = st.lists(st.integers(0, (1 << 32) - 1), max_size=8).map(tuple)
HASH32 = st.binary(min_size=32, max_size=32)
SESSION = st.binary(min_size=16, max_size=16)
URI = st.text(max_size=24)
PERCENT = st.integers(0, 100)


def _opt(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(st.none(), strategy)


samplings = st.builds(
    Sampling, temperature_milli=_opt(U64), top_k=_opt(U64), top_p_milli=_opt(st.integers(0, 1000)), seed=_opt(U64),
)
contracts = st.builds(
    Contract,
    target=HASH32, tokenizer=HASH32, rule=st.sampled_from([1, 2]), m_max=st.integers(1, 64), max_new=U64,
    stop=TOKENS, low_rounds=st.integers(1, (1 << 64) - 1),
    fallback=st.lists(st.sampled_from([1, 2, 3, 5]), min_size=1, max_size=6).map(tuple),
    drafters=_opt(st.lists(HASH32, min_size=1, max_size=3).map(tuple)), sampling=_opt(samplings),
    low_ratio=_opt(PERCENT), self_load=_opt(PERCENT), self_max=_opt(U64), scope=_opt(st.binary(min_size=16, max_size=16)),
)
resumes = st.builds(Resume, round=U64, committed=U64, digest=HASH32, committed_tokens=URI, target_kv=_opt(URI))
prompts = st.one_of(TOKENS, URI)
session_opens = st.builds(
    SessionOpen, session=SESSION, epoch=U64, contract=contracts, prompt=prompts, commit_log=URI,
    prompt_kv=_opt(URI), resume=_opt(resumes),
)
session_states = st.builds(
    SessionState, session=SESSION, epoch=U64, round=U64, committed=U64, digest=HASH32, state=_opt(U64),
)
assignments = st.builds(
    Assignment, session=SESSION, epoch=U64, contract=contracts, verifier=URI, drafter=URI, prompt=prompts,
    round=U64, committed=U64, digest=HASH32, m_init=st.integers(1, 64), sampling=_opt(samplings),
    committed_tokens=_opt(URI),
)
statuses = st.builds(
    Status, instance=URI, role=st.sampled_from([1, 2]), load=PERCENT, queue=U64, ttl_ms=U64,
    accept_milli=_opt(st.integers(0, 1000)), cache_mbps=_opt(U64),
)
proposals = st.builds(
    Proposal, session=SESSION, epoch=U64, round=U64, drafter=URI, base=U64, base_digest=HASH32,
    tokens=st.lists(st.integers(0, (1 << 32) - 1), min_size=1, max_size=8).map(tuple), status=statuses,
    q_rows=_opt(URI), draft_kv=_opt(URI),
)
verdicts = st.builds(
    Verdict, session=SESSION, epoch=U64, round=U64, accepted=U64, emitted=TOKENS, committed=U64, digest=HASH32,
    action=st.sampled_from(Action), m_cap=st.integers(1, 64), low=U64, load=PERCENT,
)
outputs = st.builds(
    Output, session=SESSION, epoch=U64, from_=U64, tokens=TOKENS, final=st.booleans(),
    finish=_opt(st.sampled_from(Action)),
)
events = st.builds(Event, session=SESSION, epoch=U64, kind=st.sampled_from(Action), committed=U64, digest=HASH32)
policies = st.builds(Policy, session=SESSION, from_round=U64, sampling=samplings)

# (class, strategy, CDDL rule name or None where the draft names no rule)
BY_CLASS: list[tuple[type[Any], st.SearchStrategy[Any], str | None]] = [
    (Sampling, samplings, "sampling"),
    (Contract, contracts, "contract"),
    (Resume, resumes, None),
    (SessionOpen, session_opens, "session-open"),
    (SessionState, session_states, "session-state"),
    (Assignment, assignments, "assignment"),
    (Status, statuses, "status"),
    (Proposal, proposals, "proposal"),
    (Verdict, verdicts, "verdict"),
    (Output, outputs, "output"),
    (Event, events, "event"),
    (Policy, policies, "policy"),
]
any_message = st.one_of(*(strategy for _, strategy, _ in BY_CLASS))

# One fixed instance per class with every optional member present.
SAMPLING = Sampling(temperature_milli=700, top_k=40, top_p_milli=950, seed=42)
CONTRACT = Contract(
    target=b"\x11" * 32, tokenizer=b"\x22" * 32, rule=2, m_max=8, max_new=256, stop=(2, 0xFFFFFFFF), low_rounds=3,
    fallback=(1, 2, 3, 5), drafters=(b"\x33" * 32,), sampling=SAMPLING, low_ratio=25, self_load=60, self_max=32,
    scope=b"\x44" * 16,
)
RESUME = Resume(round=7, committed=12, digest=b"\x55" * 32, committed_tokens="mlc://t", target_kv="mlc://kv")
SESSION_ID = bytes(range(16))
STATUS = Status(instance="https://d1", role=1, load=30, queue=2, ttl_ms=5000, accept_milli=800, cache_mbps=900)
EXAMPLES: dict[type[Any], Any] = {
    Sampling: SAMPLING,
    Contract: CONTRACT,
    Resume: RESUME,
    SessionOpen: SessionOpen(
        session=SESSION_ID, epoch=1, contract=CONTRACT, prompt=(1, 2, 3), commit_log="mlc://log",
        prompt_kv="mlc://pkv", resume=RESUME,
    ),
    SessionState: SessionState(session=SESSION_ID, epoch=1, round=0, committed=0, digest=b"\x66" * 32, state=1),
    Assignment: Assignment(
        session=SESSION_ID, epoch=1, contract=CONTRACT, verifier="https://v", drafter="https://d1", prompt="mlc://p",
        round=0, committed=0, digest=b"\x66" * 32, m_init=4, sampling=SAMPLING, committed_tokens="mlc://c",
    ),
    Status: STATUS,
    Proposal: Proposal(
        session=SESSION_ID, epoch=1, round=1, drafter="https://d1", base=0, base_digest=b"\x66" * 32,
        tokens=(5, 6, 7), status=STATUS, q_rows="mlc://q", draft_kv="mlc://dkv",
    ),
    Verdict: Verdict(
        session=SESSION_ID, epoch=1, round=1, accepted=2, emitted=(5, 6, 9), committed=3, digest=b"\x77" * 32,
        action=Action.CONTINUE, m_cap=8, low=0, load=40,
    ),
    Output: Output(session=SESSION_ID, epoch=1, from_=0, tokens=(5, 6, 9), final=True, finish=Action.FINISH),
    Event: Event(session=SESSION_ID, epoch=1, kind=Action.SWITCH, committed=3, digest=b"\x77" * 32),
    Policy: Policy(session=SESSION_ID, from_round=4, sampling=SAMPLING),
}
