"""Conformance: §5.2 Message Definitions."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import pytest
import torch

from sdcp_fast.protocol import cbor
from sdcp_fast.protocol.messages import (
    Action,
    Assignment,
    Event,
    Output,
    Policy,
    Proposal,
    SessionOpen,
    SessionState,
    Status,
    Verdict,
)
from sdcp_fast.protocol.problems import BadRequest

SID = bytes(range(16))
H32 = b"\xaa" * 32
CONTRACT: dict[str, Any] = {
    "target": b"\x10" * 32, "tokenizer": b"\x20" * 32, "rule": 1, "m_max": 4, "max_new": 8, "stop": [],
    "low_rounds": 1, "fallback": [5],
}
STATUS: dict[str, Any] = {"instance": "https://d", "role": 1, "load": 10, "queue": 0, "ttl_ms": 1000}
MAPS: dict[type[Any], dict[str, Any]] = {
    SessionOpen: {"session": SID, "epoch": 1, "contract": CONTRACT, "prompt": [1], "commit_log": "mlc://l",
                  "resume": {"round": 1, "committed": 1, "digest": H32, "committed_tokens": "mlc://c"}},
    SessionState: {"session": SID, "epoch": 1, "round": 0, "committed": 0, "digest": H32},
    Assignment: {"session": SID, "epoch": 1, "contract": CONTRACT, "verifier": "https://v", "drafter": "https://d",
                 "prompt": "mlc://p", "round": 0, "committed": 0, "digest": H32, "m_init": 2,
                 "sampling": {"top_k": 5}},
    Proposal: {"session": SID, "epoch": 1, "round": 1, "drafter": "https://d", "base": 0, "base_digest": H32,
               "tokens": [4, 5], "status": STATUS},
    Verdict: {"session": SID, "epoch": 1, "round": 1, "accepted": 1, "emitted": [4, 7], "committed": 2,
              "digest": H32, "action": 0, "m_cap": 4, "low": 0, "load": 50},
    Output: {"session": SID, "epoch": 1, "from": 0, "tokens": [4, 7], "final": True, "finish": 4},
    Status: STATUS,
    Event: {"session": SID, "epoch": 1, "kind": 2, "committed": 2, "digest": H32},
    Policy: {"session": SID, "from_round": 3, "sampling": {"temperature_milli": 0}},
}
CLASSES = list(MAPS)
IDS = [c.__name__ for c in CLASSES]


def decode(cls: type[Any], raw: dict[str, Any]) -> Any:
    return cls.decode(cbor.deterministic_cbor(raw))


@pytest.mark.parametrize("cls", CLASSES, ids=IDS)
def test_unknown_map_keys_are_ignored_outside_the_contract(cls: type[Any]) -> None:
    """§5.2: unknown map keys MUST be ignored, except in the contract (Section 4.1)."""
    assert decode(cls, {**MAPS[cls], "x-future": {"nested": [1]}, 7: b""}) == decode(cls, MAPS[cls])


def test_unknown_keys_in_nested_non_contract_maps_are_ignored() -> None:
    """§5.2: unknown keys are ignored in nested maps too (resume, status, a policy's sampling)."""
    raw = {**MAPS[SessionOpen], "resume": {**MAPS[SessionOpen]["resume"], "x": 1}}
    assert decode(SessionOpen, raw) == decode(SessionOpen, MAPS[SessionOpen])
    raw = {**MAPS[Proposal], "status": {**STATUS, "x": 1}}
    assert decode(Proposal, raw) == decode(Proposal, MAPS[Proposal])
    raw = {**MAPS[Policy], "sampling": {"temperature_milli": 0, "x": 1}}
    assert decode(Policy, raw) == decode(Policy, MAPS[Policy])


@pytest.mark.parametrize(("cls", "key"), [(Verdict, "action"), (Output, "finish"), (Event, "kind")])
@pytest.mark.parametrize("value", [6, 1000, (1 << 64) - 1])
def test_unknown_action_value_is_treated_as_fail(cls: type[Any], key: str, value: int) -> None:
    """§5.2: a receiver that encounters an unknown action value MUST treat it as "fail"."""
    assert getattr(decode(cls, {**MAPS[cls], key: value}), key) is Action.FAIL


@pytest.mark.parametrize("size", [0, 15, 17, 32])
def test_session_id_is_exactly_16_bytes(size: int) -> None:
    """§5.2: session-id = bstr .size 16."""
    for cls in (SessionState, Verdict, Event, Policy):
        with pytest.raises(BadRequest):
            decode(cls, {**MAPS[cls], "session": bytes(size)})


def test_digests_are_hash32() -> None:
    """§5.2: digest, base_digest and resume.digest are hash32 (bstr .size 32)."""
    with pytest.raises(BadRequest):
        decode(Verdict, {**MAPS[Verdict], "digest": bytes(31)})
    with pytest.raises(BadRequest):
        decode(Proposal, {**MAPS[Proposal], "base_digest": bytes(33)})
    with pytest.raises(BadRequest):
        decode(SessionOpen, {**MAPS[SessionOpen], "resume": {**MAPS[SessionOpen]["resume"], "digest": b""}})


def test_load_is_a_percentage() -> None:
    """§5.2: verdict.load and status.load are uint .le 100."""
    assert decode(Verdict, {**MAPS[Verdict], "load": 100}).load == 100
    with pytest.raises(BadRequest):
        decode(Verdict, {**MAPS[Verdict], "load": 101})
    with pytest.raises(BadRequest):
        decode(Status, {**STATUS, "load": 101})


def test_status_role_is_1_drafter_or_2_verifier() -> None:
    """§5.2: status.role is 1 (drafter) or 2 (verifier)."""
    assert decode(Status, {**STATUS, "role": 2}).role == 2
    for role in (0, 3):
        with pytest.raises(BadRequest):
            decode(Status, {**STATUS, "role": role})


def test_status_accept_milli_is_at_most_1000() -> None:
    """§5.2: status.accept_milli is uint .le 1000."""
    assert decode(Status, {**STATUS, "accept_milli": 1000}).accept_milli == 1000
    with pytest.raises(BadRequest):
        decode(Status, {**STATUS, "accept_milli": 1001})


def test_proposal_carries_at_least_one_token() -> None:
    """§5.2: proposal.tokens is [+ uint] (M >= 1 proposed tokens)."""
    with pytest.raises(BadRequest):
        decode(Proposal, {**MAPS[Proposal], "tokens": []})


def test_prompt_is_a_token_list_or_a_cache_reference() -> None:
    """§5.2: prompt: [* uint] / cache-ref."""
    assert decode(SessionOpen, {**MAPS[SessionOpen], "prompt": "mlc://p"}).prompt == "mlc://p"
    assert decode(SessionOpen, {**MAPS[SessionOpen], "prompt": []}).prompt == ()
    with pytest.raises(BadRequest):
        decode(SessionOpen, {**MAPS[SessionOpen], "prompt": b"\x01"})


def test_output_from_key_and_final_bool() -> None:
    """§5.2: output = {session, epoch, from: uint, tokens, final: bool, ? finish: action}."""
    assert decode(Output, MAPS[Output]).from_ == 0
    with pytest.raises(BadRequest):
        decode(Output, {**MAPS[Output], "final": 1})
    with pytest.raises(BadRequest):
        decode(Output, {k: v for k, v in MAPS[Output].items() if k != "from"})


@pytest.mark.parametrize("cls", CLASSES, ids=IDS)
def test_every_required_member_is_required(cls: type[Any]) -> None:
    """§5.2: members without "?" are required; a message without one is malformed."""
    for member in cls._members:
        if member.optional:
            continue
        with pytest.raises(BadRequest):
            decode(cls, {k: v for k, v in MAPS[cls].items() if k != member.wire})


@pytest.mark.parametrize("cls", CLASSES, ids=IDS)
def test_optional_members_can_be_left_out_and_are_not_sent_when_absent(cls: type[Any]) -> None:
    """§5.2: members marked "?" may be absent; an absent member is not encoded (no null)."""
    required = {k: v for k, v in MAPS[cls].items() if k in {m.wire for m in cls._members if not m.optional}}
    msg = decode(cls, required)
    assert cbor.decode(msg.encode()).keys() == required.keys()


def _drafters() -> list[Any]:
    from sdcp_fast.model.config import ModelConfig
    from sdcp_fast.model.drafters import ModelDrafter
    from sdcp_fast.model.llama import Transformer
    from sdcp_fast.model.toy import ToyDrafter, ToyTarget

    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=61, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=48))
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.3)
    return [ToyDrafter("toy", ToyTarget(), 0.8), ModelDrafter(model)]


@pytest.mark.parametrize("drafter", _drafters(), ids=["toy", "model"])
def test_drafter_samples_each_token_from_the_row_it_publishes(drafter: Any) -> None:
    """§5.2: the drafter MUST sample each proposed token from exactly the row it publishes.
    Each published row is the drafter's distribution after the tokens before it, under the
    session's profile, and gives its token a nonzero probability; over 2,000 seeded drafts the
    first token's frequencies are the first row's (total variation under 0.06)."""
    prompt, profile = [3, 5, 7], {"temperature_milli": 900, "top_k": 3}
    draft = drafter.propose(b"s" * 16, prompt, 4, rule=2, generator=torch.Generator().manual_seed(1), **profile)
    assert draft.q_rows.dtype == torch.float32 and tuple(draft.q_rows.shape) == (4, drafter_vocab(drafter))
    for i, token in enumerate(draft.tokens):
        again = drafter.propose(b"s" * 16, [*prompt, *draft.tokens[:i]], 1, rule=2, **profile)
        assert torch.allclose(draft.q_rows[i], again.q_rows[0], atol=1e-6) and draft.q_rows[i, token] > 0
    counts = torch.zeros_like(draft.q_rows[0], dtype=torch.float64)
    for seed in range(2000):
        first = drafter.propose(b"s" * 16, prompt, 1, rule=2, generator=torch.Generator().manual_seed(seed), **profile)
        counts[first.tokens[0]] += 1
    assert float((counts / 2000 - draft.q_rows[0].double()).abs().sum()) / 2 < 0.06


def drafter_vocab(drafter: Any) -> int:
    return int(getattr(drafter, "vocab_size", None) or drafter.target.vocab_size)


def test_q_rows_are_little_endian_binary32_rows_in_position_order(tmp_path: Path) -> None:
    """§5.2: q_rows holds one row of V IEEE 754 binary32 values, little-endian, per proposed position,
    concatenated in position order. The drafter's rows ([M, V] float32) stored in the MLC are
    those octets, and the verifier reads q[i](x[i]) from row i, column x[i], of them."""
    from sdcp_fast.protocol.acceptance import q_of_tokens
    from sdcp_fast.protocol.problems import BadProposal
    from sdcp_fast.store import embedded

    vocab, tokens = 5, [4, 0, 2]
    rows = torch.arange(1, 1 + len(tokens) * vocab, dtype=torch.float32).reshape(len(tokens), vocab) / 64
    octets = struct.pack(f"<{rows.numel()}f", *rows.flatten().tolist())
    mlc = embedded(str(tmp_path))
    try:
        mlc.mlc.put("mlc://q/rows", rows.contiguous())
        assert bytes(mlc.mlc.get("mlc://q/rows")) == octets
    finally:
        mlc.close()
    assert q_of_tokens(octets, tokens, vocab) == [float(rows[i, x]) for i, x in enumerate(tokens)]
    big_endian = struct.pack(f">{rows.numel()}f", *rows.flatten().tolist())
    assert q_of_tokens(big_endian, tokens, vocab) != q_of_tokens(octets, tokens, vocab)
    with pytest.raises(BadProposal):
        q_of_tokens(octets[:-4], tokens, vocab)  # not M rows of V values
