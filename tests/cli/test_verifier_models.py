"""``sdcp-fast verifier --model DIR`` serves a checkpoint of each family the loader reads (tiny
random ones made with transformers): the role the command builds, on an in-process network,
opens a session whose contract names the weights digest of its model, commits the tokens
transformers' greedy decoding gives, and refuses a contract naming another model of the same
shape (§6.1, sdcp-bad-contract)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sdcp_fast.cli import build_parser
from sdcp_fast.cli import verifier as verifier_cli
from sdcp_fast.deploy.catalog import load_target
from sdcp_fast.model.contract_digests import weights_digest
from sdcp_fast.protocol import SdcpProblem
from sdcp_fast.roles.wire import SdcpClient
from sdcp_fast.store import embedded
from sdcp_fast.transport.inprocess import InProcessNetwork
from tests.model import families
from tests.roles.rolekit import (
    DRAFTER_PEER,
    ROUTER_PEER,
    VERIFIER,
    VERIFIER_PEER,
    assignment,
    contract,
    proposal,
    run,
    session_open,
    sid,
)

PROMPT = list(range(40, 52))


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3", "mistral", "gemma2", "gemma3", "phi3"])
def test_verifier_serves_each_family_and_refuses_another_models_contract(family, tmp_path) -> None:
    families.require_transformers()
    path, twin = tmp_path / family, tmp_path / "twin"
    hf = families.make_checkpoint(family, path, seed=0)
    families.make_checkpoint(family, twin, seed=1)  # the same shape, other weights
    want = families.hf_greedy(hf, PROMPT, 4)
    args = build_parser().parse_args(["verifier", "--model", str(path), "--insecure", "--uri", VERIFIER,
                                      "--backend", "reference"])
    target = load_target(args.model, args.device)
    other = load_target(str(twin)).digest
    assert target.digest == weights_digest(target.loaded.model) != other
    chat = target.prompt("hi")  # the tokenizer config's template: <bos>, then two <|im_start|> turns
    assert chat[0] == families.BOS and chat.count(258) == 2 and target.prompt("hi", raw=True) == target.encode("hi")

    async def scenario() -> None:
        network = InProcessNetwork()
        store = embedded(str(tmp_path / "store"))
        role = verifier_cli._role(args, target, store, network.transport(VERIFIER_PEER))
        network.register(VERIFIER, role.handler)
        await role.start()
        router, drafter = SdcpClient(network.transport(ROUTER_PEER)), SdcpClient(network.transport(DRAFTER_PEER))
        try:
            c = contract(max_new=8, tokenizer=target.tokenizer_digest, stop=(families.EOS,))
            with pytest.raises(SdcpProblem) as refused:
                await router.open_session(VERIFIER, session_open(sid(1), replace(c, target=other),
                                                                 prompt=PROMPT))
            assert (refused.value.suffix, refused.value.status) == ("sdcp-bad-contract", 422)
            opened = session_open(sid(2), replace(c, target=target.digest), prompt=PROMPT)
            state = await router.open_session(VERIFIER, opened)
            state = await router.put_drafter(VERIFIER, assignment(opened, state, m_init=4))
            verdict = await drafter.propose(VERIFIER, proposal(state, want[:3]))
            assert list(verdict.emitted) == want[:4] and verdict.accepted == 3
        finally:
            await role.close()
            store.close()

    run(scenario(), timeout=60)
