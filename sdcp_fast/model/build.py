"""What a loaded model says about its prompts: its stop tokens and its chat template."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from .loader import LoadedModel


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
