"""Build runners and drafters from command-line style specs (``generate``, ``bench``, ``demo``)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch

from sdcp_fast.model.interfaces import Drafter

from . import loader
from .drafters import ModelDrafter, NgramDrafter
from .loader import LoadedModel

DRAFTER_SPECS = "none | ngram | layerskip:L | model:PATH|NAME"


def make_drafter(spec: str, target: LoadedModel, dtype: torch.dtype = torch.float32) -> Drafter | None:
    kind, _, arg = spec.partition(":")
    if kind == "none":
        return None
    if kind == "ngram":
        return NgramDrafter(target.config.vocab_size)
    if kind == "layerskip":
        n = int(arg or 4)
        return ModelDrafter(target.model, n_layers=n)
    if kind == "model":
        draft = loader.load(arg or "smollm2-draft", dtype, borrow=target.model)
        if draft.config.vocab_size != target.config.vocab_size:
            raise ValueError(f"draft vocabulary {draft.config.vocab_size} != target's {target.config.vocab_size}")
        return ModelDrafter(draft.model, name=f"model:{arg or 'smollm2-draft'}")
    raise ValueError(f"unknown drafter {spec!r} (expected {DRAFTER_SPECS})")


def stop_tokens(lm: LoadedModel) -> list[int]:
    stops = set(lm.config.eos_token_ids)
    if lm.tokenizer is not None:
        for name in ("<|im_end|>", "<|eot_id|>", "<|endoftext|>"):
            tid = lm.tokenizer.token_to_id(name)
            if tid is not None:
                stops.add(tid)
    return sorted(stops)


def uses_chatml(lm: LoadedModel) -> bool:
    return lm.tokenizer is not None and lm.tokenizer.token_to_id("<|im_start|>") is not None


def chat_template(lm: LoadedModel) -> Callable[[str], str] | None:
    """The model's chat template for one user turn: the jinja template its tokenizer config
    ships (rendered as transformers does), else ChatML where the tokenizer has its markers,
    else None (raw prompts)."""
    from .tokenizer import chat_prompt, render_chat

    template = lm.meta.get("chat_template")
    if template:
        return partial(render_chat, template, tokens=lm.meta.get("chat_tokens") or {})
    return chat_prompt if uses_chatml(lm) else None
