"""Text and tokens for the OpenAI-compatible front end (:mod:`sdcp_fast.roles.frontend`): what
it needs of a tokenizer, the toy model's and a ``tokenizers`` one with ChatML, and the
incremental decoder that turns committed output into text pieces without splitting a
character.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol


class TextTokenizer(Protocol):
    """What the front end needs of a tokenizer: text <-> ids and the model's chat template."""

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def chat(self, messages: Sequence[Mapping[str, str]]) -> str:
        """The prompt for ``messages`` ({"role", "content"}), ending where the assistant speaks."""
        ...


class ToyWords:
    """The toy model's word list (``sdcp_fast.model.toy``). It has no chat format: a chat is
    its messages' words in order."""

    def encode(self, text: str) -> list[int]:
        from sdcp_fast.model import toy

        return toy.encode(text)

    def decode(self, ids: Sequence[int]) -> str:
        from sdcp_fast.model import toy

        return toy.decode(ids)

    def chat(self, messages: Sequence[Mapping[str, str]]) -> str:
        return " ".join(m["content"] for m in messages)


class HFTokenizer:
    """A ``tokenizers.Tokenizer`` with ChatML (SmolLM2-Instruct, Qwen2.5;
    :func:`sdcp_fast.model.tokenizer.chat_prompt` for one user turn)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Sequence[int]) -> str:
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=True))

    def chat(self, messages: Sequence[Mapping[str, str]]) -> str:
        turns = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
        return turns + "<|im_start|>assistant\n"

    def stop_tokens(self) -> tuple[int, ...]:
        """The ids of ChatML's end of turn and the usual end-of-text tokens it knows."""
        names = ("<|im_end|>", "<|endoftext|>", "</s>", "<|eot_id|>")
        ids = (self.tokenizer.token_to_id(n) for n in names)
        return tuple(i for i in ids if i is not None)


class IncrementalDecoder:
    """Text of a growing token sequence, piece by piece. A piece is decoded together with the
    tokens before it (tokenizers join pieces with spaces or merge bytes across tokens) and
    held back while it ends in an incomplete UTF-8 sequence (U+FFFD), so no character is
    split or repeated; :meth:`flush` gives what is left at the end."""

    def __init__(self, tokenizer: TextTokenizer, skip: Sequence[int] = ()) -> None:
        self.tokenizer = tokenizer
        self.skip = frozenset(skip)
        self.ids: list[int] = []
        self._prefix = 0  # ids[_prefix:_read] were decoded already, as context
        self._read = 0

    def push(self, tokens: Sequence[int]) -> str:
        self.ids.extend(t for t in tokens if t not in self.skip)
        return self._advance(final=False)

    def flush(self) -> str:
        return self._advance(final=True)

    @property
    def caught_up(self) -> bool:
        """Whether the text given so far is that of every token pushed (none held back)."""
        return self._read == len(self.ids)

    def _advance(self, final: bool) -> str:
        if self._read == len(self.ids):
            return ""
        before = self.tokenizer.decode(self.ids[self._prefix:self._read]) if self._read > self._prefix else ""
        text = self.tokenizer.decode(self.ids[self._prefix:])
        if not final and (text.endswith("\ufffd") or len(text) <= len(before)):
            return ""
        piece = text[len(before):]
        self._prefix, self._read = self._read, len(self.ids)
        return piece


CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
          "'<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def save_tokenizer(tokenizer: TextTokenizer, directory: str | Path, *, context: int | None = None) -> Path:
    """``tokenizer`` as a Hugging Face tokenizer folder (``tokenizer.json``,
    ``tokenizer_config.json``) that ``transformers.AutoTokenizer.from_pretrained(directory)``
    loads: what load generators (AIPerf, vLLM's benchmarks) count tokens with. The toy
    model's words become a word-level tokenizer with the same ids."""
    import json

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    config: dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False}
    if isinstance(tokenizer, HFTokenizer):
        tokenizer.tokenizer.save(str(folder / "tokenizer.json"))
        config["chat_template"] = CHATML
        stops = [tokenizer.tokenizer.id_to_token(i) for i in tokenizer.stop_tokens()]
        if stops:
            config["eos_token"] = stops[0]
    else:
        from sdcp_fast.model.toy import EOS, WORDS

        words = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token=WORDS[EOS]))
        words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        words.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
        words.save(str(folder / "tokenizer.json"))
        config["eos_token"] = WORDS[EOS]
    if context is not None:
        config["model_max_length"] = context
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=1) + "\n")
    return folder
