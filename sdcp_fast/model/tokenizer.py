"""Tokenizers: a ``tokenizers.Tokenizer`` from ``tokenizer.json`` or rebuilt from a GGUF's
BPE vocabulary and merges (no ``transformers`` needed)."""

from __future__ import annotations

import json
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

# Pre-tokenizer split patterns of llama.cpp's `tokenizer.ggml.pre` names.
_LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
           r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
          r"|\s*[\r\n]+|\s+(?!\S)|\s+")

_CONTROL = 3  # llama.cpp token type of special tokens
_USER_DEFINED = 4


def _pre_tokenizer(pre: str) -> Any:
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in ("smollm", "starcoder", "refact"):
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    if pre in ("llama-bpe", "llama3", "smaug-bpe"):
        split = pre_tokenizers.Split(Regex(_LLAMA3), behavior="isolated")
        return pre_tokenizers.Sequence([split, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    if pre == "qwen2":
        split = pre_tokenizers.Split(Regex(_QWEN2), behavior="isolated")
        return pre_tokenizers.Sequence([split, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    if pre in ("gpt2", "default", ""):
        return byte_level
    raise ValueError(f"GGUF pre-tokenizer {pre!r} is not supported")


def tokenizer_from_gguf(fields: dict[str, Any]) -> Tokenizer:
    """``fields`` maps GGUF metadata keys to decoded values (lists, strings, ints)."""
    kind = fields.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise ValueError(f"GGUF tokenizer model {kind!r} is not supported (only byte-level BPE, 'gpt2')")
    tokens: list[str] = fields["tokenizer.ggml.tokens"]
    merges = [tuple(m.split(" ", 1)) for m in fields.get("tokenizer.ggml.merges") or []]
    types: list[int] = fields.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    vocab = {t: i for i, t in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = _pre_tokenizer(fields.get("tokenizer.ggml.pre", "gpt2"))
    tok.decoder = decoders.ByteLevel()
    special = [AddedToken(t, special=True, normalized=False) for t, ty in zip(tokens, types, strict=True)
               if ty == _CONTROL]
    user = [AddedToken(t, special=False, normalized=False) for t, ty in zip(tokens, types, strict=True)
            if ty == _USER_DEFINED]
    tok.add_special_tokens(special)
    if user:
        tok.add_tokens(user)
    return tok


def encode(tok: Tokenizer, text: str) -> list[int]:
    return list(tok.encode(text, add_special_tokens=False).ids)


def decode(tok: Tokenizer, ids: list[int]) -> str:
    return str(tok.decode(ids, skip_special_tokens=False))


def render_chat(template: str, user: str, system: str | None = None, tokens: dict[str, str] | None = None) -> str:
    """One user turn (after ``system``, if given) through a Hugging Face jinja chat template,
    ending with the generation prompt, rendered as transformers' ``apply_chat_template``
    renders it (a sandbox, trimmed blocks, loop controls, ``raise_exception``, ``tojson``).
    ``tokens``: the special tokens the template names (``bos_token``, ``eos_token``)."""
    from datetime import datetime

    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise ValueError(f"chat template: {message}")

    def tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
               sort_keys: bool = False) -> str:
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals.update(raise_exception=raise_exception,
                       strftime_now=lambda fmt: datetime.now().strftime(fmt))  # Llama 3.x templates date the turn
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]
    return str(env.from_string(template).render(messages=messages, add_generation_prompt=True, **(tokens or {})))


def chat_prompt(user: str, system: str | None = None) -> str:
    """ChatML, the template SmolLM2-Instruct and Qwen2.5 use."""
    sys_part = f"<|im_start|>system\n{system}<|im_end|>\n" if system else ""
    return f"{sys_part}<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"
