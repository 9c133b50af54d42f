"""What a distillation run (:mod:`sdcp_fast.model.distill`) is told, :class:`DistillConfig`, and
what it trains on, ``OUT/data.pt`` (built once, resumable stage by stage):

1. prompts: the built-in *train* set, plus ``self_prompts`` user turns the target writes
   itself (sampled after ``<|im_start|>user`` and a starter word: a far wider spread of
   questions than any fixed list), plus ``copy_prompts`` copy/edit/summarize requests made
   by wrapping the target's own answers in the built-in set's instructions;
2. answers: the target's greedy continuations (what a rule-1 drafter sees at run time),
   plus ``samples`` sampled ones per built-in prompt, each token with the target's top-K
   logits before it (the labels: free, the pass that chose the token computed them).
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from sdcp_fast import data

from .bulk import generate_rows
from .loader import LoadedModel
from .tokenizer import chat_prompt, decode, encode

# Opening words for the user turns the target writes itself (spread the questions out).
STARTERS = ("How", "What", "Why", "Can you", "Write", "Explain", "Give me", "Tell me", "List", "Describe",
            "Please", "Compare", "Is it", "Help me", "I want", "Which", "When", "Where", "Who", "Should I",
            "Create", "Summarize", "Suggest", "Do you", "My", "Plan", "Translate", "Name", "Define", "Outline")


@dataclass
class DistillConfig:
    layers: tuple[int, ...] = (2,)  # one draft per depth, trained side by side
    head_vocab: int = 8192  # ids the draft's output layer covers (0: the whole vocabulary)
    prompts: int = 344  # built-in train prompts used
    self_prompts: int = 0  # user turns written by the target itself, then answered
    copy_prompts: int = 0  # copy/edit/summarize prompts made from the target's answers
    gen_tokens: int = 128  # answer tokens generated per prompt
    gen_batch: int = 32  # rows decoded side by side
    samples: int = 0  # sampled (temperature 0.8) answers per built-in prompt, besides the greedy one
    top_k: int = 32  # target logits kept per answer token as its label
    steps: int = 600
    batch_tokens: int = 2048  # tokens per training step (padding included)
    lr: float = 5e-4
    weight_decay: float = 0.0
    warmup: int = 20
    minutes: float = 60.0  # budget for the whole run; training stops (and saves) when it is spent
    seed: int = 0
    holdout: float = 0.02  # share of the data kept out of training, for the held-out agreement
    extra_data: tuple[str, ...] = ()  # data.pt files of earlier runs (other seeds) to train on too


class TeacherData:
    """``OUT/data.pt``: the self-written prompts, then ``prompt + answer`` sequences in the
    order they were generated with each answer token's label; ``done`` counts the jobs
    answered."""

    def __init__(self, path: Path) -> None:
        self.path = path
        d = torch.load(path, weights_only=True) if path.is_file() else {}
        self.self_prompts: list[str] | None = d.get("self_prompts")
        self.seqs: list[list[int]] = d.get("seqs", [])
        self.prompt_lens: list[int] = d.get("prompt_lens", [])
        self.top_ids: list[torch.Tensor] = d.get("top_ids", [])  # [answer_len, K] int32 each
        self.top_logits: list[torch.Tensor] = d.get("top_logits", [])  # [answer_len, K] float16 each
        self.done: int = d.get("done", 0)
        self._saved = time.monotonic()

    def merge(self, other: TeacherData) -> None:
        """Add ``other``'s sequences that are not here yet (in memory only)."""
        if not other.path.is_file():
            raise FileNotFoundError(f"{other.path}: no such data file")
        seen = {tuple(s) for s in self.seqs}
        for i, s in enumerate(other.seqs):
            if tuple(s) not in seen:
                seen.add(tuple(s))
                self.seqs.append(s)
                self.prompt_lens.append(other.prompt_lens[i])
                self.top_ids.append(other.top_ids[i])
                self.top_logits.append(other.top_logits[i])

    def save(self, force: bool = False) -> None:
        if force or time.monotonic() - self._saved > 60:
            tmp = self.path.with_suffix(".tmp")
            torch.save({"self_prompts": self.self_prompts, "seqs": self.seqs, "prompt_lens": self.prompt_lens,
                        "top_ids": self.top_ids, "top_logits": self.top_logits, "done": self.done}, tmp)
            tmp.replace(self.path)
            self._saved = time.monotonic()


def _self_prompts(target: LoadedModel, cfg: DistillConfig, deadline: float) -> list[str]:
    """User turns sampled from the target (temperature 1, top-p 0.95), each opened by a
    starter word; the ones it closes with its end-of-turn token within 64 tokens."""
    assert target.tokenizer is not None
    rng = random.Random(cfg.seed)
    stop = list(target.config.eos_token_ids)
    out: list[str] = []
    bar = tqdm(total=cfg.self_prompts, desc="self-written prompts", unit="prompt")
    for i in range(0, cfg.self_prompts * 2, cfg.gen_batch):  # about half survive the filters
        starters = [rng.choice(STARTERS) for _ in range(cfg.gen_batch)]
        heads = [encode(target.tokenizer, f"<|im_start|>user\n{w}") for w in starters]
        g = torch.Generator().manual_seed(cfg.seed * 7919 + i)
        for w, row in zip(starters, generate_rows(target.model, heads, 64, temperature_milli=1000, top_p_milli=950,
                                                  stop=stop, generator=g), strict=True):
            ans = row.tokens
            if len(ans) >= 4 and ans[-1] in stop:
                text = (w + decode(target.tokenizer, ans[:-1])).strip()
                if text and "<|" not in text:
                    out.append(text)
        bar.update(min(len(out), cfg.self_prompts) - bar.n)
        if len(out) >= cfg.self_prompts or time.monotonic() > deadline:
            break
    bar.close()
    return list(dict.fromkeys(out))[: cfg.self_prompts]


def _copy_prompts(target: LoadedModel, cfg: DistillConfig, d: TeacherData, n_chat: int) -> list[str]:
    """The built-in set's copy/edit/summarize instructions around the target's own answers."""
    assert target.tokenizer is not None
    instructions = sorted({p["text"].split("\n\n", 1)[0] for p in data.prompts("train") if p["kind"] == "copy"})
    texts = []
    for seq, plen in zip(d.seqs[:n_chat], d.prompt_lens[:n_chat], strict=True):
        text = decode(target.tokenizer, [t for t in seq[plen:] if t not in target.config.eos_token_ids])
        text = text[: text.rfind(".") + 1].strip()
        if len(text) >= 80 and "<|" not in text:
            texts.append(text)
    rng = random.Random(cfg.seed + 1)
    rng.shuffle(texts)
    return [f"{rng.choice(instructions)}\n\n{t}" for t in texts[: cfg.copy_prompts]]


def _answer(target: LoadedModel, cfg: DistillConfig, d: TeacherData, jobs: list[tuple[list[int], int]], first: int,
            desc: str, deadline: float) -> bool:
    """Answer jobs ``(prompt, k)`` (k = 0: greedy, else sampled), those numbered from
    ``first`` on in ``d.done``'s count; similar lengths share a batch. False if the time ran out."""
    stop = list(target.config.eos_token_ids)
    order = sorted(range(len(jobs)), key=lambda j: (jobs[j][1], len(jobs[j][0])))
    bar = tqdm(total=len(jobs), initial=d.done - first, desc=desc, unit="seq")
    for i in range(d.done - first, len(order), cfg.gen_batch):
        if time.monotonic() > deadline:
            bar.close()
            return False
        chunk = [jobs[j] for j in order[i:i + cfg.gen_batch]]
        by_k: dict[int, list[list[int]]] = {}
        for p, k in chunk:
            by_k.setdefault(k, []).append(p)
        for k, rows in sorted(by_k.items()):
            g = torch.Generator().manual_seed(cfg.seed * 7919 + first + i + k)
            answers = generate_rows(target.model, rows, cfg.gen_tokens, temperature_milli=0 if k == 0 else 800,
                                    stop=stop, generator=g, top_k=cfg.top_k)
            for p, ans in zip(rows, answers, strict=True):
                assert ans.top_ids is not None and ans.top_logits is not None
                d.seqs.append(p + ans.tokens)
                d.prompt_lens.append(len(p))
                d.top_ids.append(ans.top_ids)
                d.top_logits.append(ans.top_logits)
        d.done = first + i + len(chunk)
        d.save()
        bar.update(len(chunk))
    bar.close()
    return True


def teacher_data(target: LoadedModel, cfg: DistillConfig, path: Path, deadline: float) -> TeacherData:
    """Prompts and the target's answers; stops early (resumable) at ``deadline``."""
    assert target.tokenizer is not None
    d = TeacherData(path)
    if d.self_prompts is None:
        # A third of the data budget at most: the answers are what the draft learns from.
        third = time.monotonic() + (deadline - time.monotonic()) / 3
        d.self_prompts = _self_prompts(target, cfg, third) if cfg.self_prompts else []
        d.save(force=True)
    tok = target.tokenizer
    builtin = [encode(tok, chat_prompt(p["text"])) for p in data.prompts("train")][: cfg.prompts]
    chat = [(p, 0) for p in builtin + [encode(tok, chat_prompt(t)) for t in d.self_prompts]]
    chat += [(p, k) for k in range(1, 1 + cfg.samples) for p in builtin]
    if d.done < len(chat) and not _answer(target, cfg, d, chat, 0, "answers", deadline):
        d.save(force=True)
        return d
    copies = [(encode(tok, chat_prompt(t)), 0) for t in _copy_prompts(target, cfg, d, len(chat))]
    if copies and d.done < len(chat) + len(copies):
        _answer(target, cfg, d, copies, len(chat), "copy answers", deadline)
    d.save(force=True)
    return d
