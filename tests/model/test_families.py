"""Every family the loader reads, against transformers on tiny random checkpoints: the
logits at every position of a prompt longer than the sliding window (each attention path:
gather + SDPA, the paged reference, the paged triton kernel), the same after a cached
prefix, greedy decoding through the roles, batched scoring of sessions of different
lengths against each alone, and the chat template as transformers renders it."""

from __future__ import annotations

import pytest
import torch

from sdcp_fast.model import loader
from sdcp_fast.model.interfaces import ScoreRequest
from sdcp_fast.model.target_scorer import ModelRunner

from .families import EOS, WINDOW, hf_greedy, hf_logits, make_checkpoint, require_transformers

FAMILIES = ["llama", "qwen2", "qwen3", "mistral", "gemma2", "gemma3", "phi3"]
WINDOWED = ["qwen2", "mistral", "gemma2", "gemma3", "phi3"]  # a window (Gemma 2: soft-caps too)
TOL = dict(atol=1e-4, rtol=1e-4)  # float32 on both sides
PROMPT = torch.randint(0, 256, (44,), generator=torch.Generator().manual_seed(7)).tolist()


@pytest.fixture(scope="module", params=FAMILIES)
def pair(request, tmp_path_factory):
    """(transformers' model, ours loaded from its directory, the directory)."""
    require_transformers()
    path = tmp_path_factory.mktemp(request.param)
    hf = make_checkpoint(request.param, path)
    return hf, loader.load(path), path


@pytest.fixture(scope="module")
def reference(pair) -> torch.Tensor:
    return hf_logits(pair[0], PROMPT)  # [T, V]


def _all_positions(runner: ModelRunner, tokens: list[int], session: bytes = b"s") -> torch.Tensor:
    return runner.score([ScoreRequest(session, tokens[:1], tokens[1:])])[0]  # [T, V]


@pytest.mark.parametrize("attention", ["sdpa", "reference"])
def test_logits_equal_transformers_at_every_position(pair, reference, attention) -> None:
    assert len(PROMPT) > 5 * WINDOW
    torch.testing.assert_close(_all_positions(ModelRunner(pair[1].model, attention=attention), PROMPT), reference,
                               **TOL)


@pytest.mark.parametrize("pair", WINDOWED, indirect=True)
def test_triton_paged_kernel_logits_equal_transformers(pair, reference) -> None:
    """The triton kernel (interpreted without a GPU: 20 positions, 2.5 windows) where the
    family gives it a window or a soft-cap to honour; plain attention is tested in tests/kernels."""
    got = _all_positions(ModelRunner(pair[1].model, attention="triton"), PROMPT[:20])
    torch.testing.assert_close(got, reference[:20], **TOL)


@pytest.mark.parametrize("attention", ["sdpa", "reference"])
def test_logits_after_a_cached_prefix_equal_transformers(pair, reference, attention) -> None:
    """Positions beyond the window read their keys from the paged cache of earlier passes."""
    runner = ModelRunner(pair[1].model, attention=attention, block_size=4)
    runner.prefill(b"s", PROMPT[:20])
    got = runner.score([ScoreRequest(b"s", PROMPT[:30], PROMPT[30:])])[0]  # positions 29..
    torch.testing.assert_close(got, reference[29:], **TOL)


@pytest.mark.parametrize("pair", WINDOWED, indirect=True)
def test_every_feature_is_exercised(pair, reference) -> None:
    """The window and the soft-caps change these logits: a model without them would differ."""
    model = pair[1].model
    cfg = model.cfg
    assert cfg.sliding_window is not None and any(b.attn.window is not None for b in model.layers)
    assert (cfg.attn_softcap is not None and cfg.logit_softcap is not None) == (cfg.family == "gemma2")
    saved = [(a, a.window, a.softcap) for a in (b.attn for b in model.layers)]
    cap = cfg.logit_softcap
    try:
        for a, _, _ in saved:
            a.window, a.softcap = None, None
        object.__setattr__(cfg, "logit_softcap", None)
        plain = _all_positions(ModelRunner(model, attention="sdpa"), PROMPT)
    finally:
        for a, w, c in saved:
            a.window, a.softcap = w, c
        object.__setattr__(cfg, "logit_softcap", cap)
    assert (plain - reference).abs().max() > 1e-2


def test_greedy_through_the_roles_equals_transformers(pair) -> None:
    from sdcp_fast.deploy.catalog import load_drafter, target_of
    from sdcp_fast.deploy.local import generate

    hf, lm, _ = pair
    prompts = [PROMPT[:30], PROMPT[:5]]
    refs = [hf_greedy(hf, p, 12) for p in prompts]
    runner = ModelRunner(lm.model)
    assert [r.tokens for r in generate(runner, None, prompts, 12, stop=(EOS,))] == refs
    # A drafter's rejections truncate the target's paged cache and reuse it: still greedy.
    drafter = load_drafter("layerskip:1", target_of("pair", lm))[0]
    spec = generate(runner, drafter, prompts[:1], 12, m=3, stop=(EOS,))[0]
    assert spec.tokens == refs[0] and spec.proposed > 0


def test_generate_command_decodes_as_transformers(pair, capsys) -> None:
    """``sdcp-fast generate --drafter none --raw`` on the directory: transformers' greedy tokens."""
    import json

    from sdcp_fast.cli import main
    from sdcp_fast.model.build import stop_tokens

    hf, lm, path = pair
    text = "The window slides over forty bytes of text, one position at a time."
    ids = lm.tokenizer.encode(text, add_special_tokens=False).ids
    assert main(["generate", "--model", str(path), "--prompt", text, "--drafter", "none", "--raw", "--json",
                 "--max-new", "8"]) == 0
    want = hf_greedy(hf, ids, 8)
    stops = [i for i, t in enumerate(want) if t in stop_tokens(lm)]  # generate also ends at <|im_end|>
    assert json.loads(capsys.readouterr().out)["tokens"] == want[: stops[0] + 1 if stops else None]


def test_batched_scoring_equals_each_session_alone(pair) -> None:
    model = pair[1].model
    reqs = [ScoreRequest(b"a", PROMPT[:9], PROMPT[9:12]), ScoreRequest(b"b", PROMPT[:40], PROMPT[40:44]),
            ScoreRequest(b"c", PROMPT[:23], PROMPT[23:24])]
    for attention in ("sdpa", "reference"):
        batched = ModelRunner(model, attention=attention).score(reqs)
        for req, got in zip(reqs, batched, strict=True):
            alone = ModelRunner(model, attention=attention).score([req])[0]
            torch.testing.assert_close(got, alone, atol=1e-5, rtol=1e-5)


def test_chat_template_renders_as_transformers(pair) -> None:
    from transformers import AutoTokenizer

    from sdcp_fast.model.build import chat_template

    lm, path = pair[1], pair[2]
    chat = chat_template(lm)
    assert chat is not None
    want = AutoTokenizer.from_pretrained(str(path)).apply_chat_template(
        [{"role": "user", "content": "Hello there "}], tokenize=False, add_generation_prompt=True)
    assert chat("Hello there ") == want
