"""Distil a small draft from its target, with the target's own greedy answers as the data.

Data: the target's own answers with their top-K logits, ``OUT/data.pt``
(:mod:`sdcp_fast.model.distill_data`, which also holds the run's options).

Drafts: the target's first ``n`` layers and final norm (copied, then trained), one per
entry of ``layers``, all trained on the same batches; the target's embedding is shared,
frozen and not shipped (borrowed at load time). The output layer covers only the
``head_vocab`` token ids the target emits most in the data (``Transformer.head_ids``), so
that it costs a fraction of the vocabulary-wide head.

Loss per answer position: KL(p_target || p_draft), p_target the target's top-K
distribution (restricted to the head's ids, renormalized), p_draft the draft's softmax
over all its head's ids. AdamW with warm-up and cosine decay over length-bucketed batches
of ``batch_tokens`` tokens. The schedule runs to ``steps`` or to the time budget, whichever
comes first, so a run cut short by ``minutes`` still ends at a low learning rate.
Checkpoints every 25 steps; rerunning the same command continues. Each draft lands in
``OUT/draft-L{n}``.
"""

from __future__ import annotations

import copy
import json
import math
import random
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from tqdm import tqdm

from . import loader
from .distill_data import DistillConfig, TeacherData, teacher_data
from .llama import Transformer, rope_inv_freq
from .loader import LoadedModel


def choose_head_ids(seqs: list[list[int]], prompt_lens: list[int], n: int, always: tuple[int, ...],
                    vocab_size: int) -> torch.Tensor:
    """``n`` ids, ascending: ``always`` (end-of-turn), then those the target emits most in
    its answers, then those most frequent in the prompts, then the smallest ids left."""
    answers = Counter(t for s, p in zip(seqs, prompt_lens, strict=True) for t in s[p:])
    prompts = Counter(t for s, p in zip(seqs, prompt_lens, strict=True) for t in s[:p])
    ids = dict.fromkeys(always)
    for counts in (answers, prompts):
        for t, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
            ids.setdefault(t)
    ids.update(dict.fromkeys(range(vocab_size)))
    return torch.tensor(sorted(list(ids)[:n]), dtype=torch.int64)


def init_draft(target: Transformer, n_layers: int, head_ids: torch.Tensor | None = None) -> Transformer:
    cfg = target.cfg.with_layers(n_layers, None if head_ids is None else len(head_ids))
    draft = Transformer.__new__(Transformer)
    torch.nn.Module.__init__(draft)
    draft.cfg = cfg
    draft.embed = target.embed  # shared and frozen
    draft.layers = torch.nn.ModuleList(copy.deepcopy(target.layers[i]) for i in range(n_layers))
    draft.norm = copy.deepcopy(target.norm)
    draft.lm_head = target.lm_head  # shared and frozen too (None when tied)
    draft.register_buffer("inv_freq", rope_inv_freq(cfg).to(target.inv_freq.device), persistent=False)
    draft.register_buffer("inv_freq_local", target.inv_freq_local, persistent=False)
    draft.register_buffer("head_ids", None if head_ids is None else head_ids.to(target.inv_freq.device))
    draft._head_rows = None
    for p in [*draft.layers.parameters(), *draft.norm.parameters()]:
        p.requires_grad_(True)
    return draft


def _batches(lens: list[int], ids: list[int], batch_tokens: int, rng: random.Random) -> list[list[int]]:
    """One epoch: sequences of similar length together, ``B * max_len <= batch_tokens``."""
    order = sorted(ids, key=lambda i: lens[i])
    out: list[list[int]] = []
    cur: list[int] = []
    for i in order:
        if cur and (len(cur) + 1) * lens[i] > batch_tokens:
            out.append(cur)
            cur = []
        cur.append(i)
    if cur:
        out.append(cur)
    rng.shuffle(out)
    return out


@dataclass
class _Batch:
    tokens: torch.Tensor  # [B, T] right-padded sequences
    label_pos: torch.Tensor  # [B, T, K] each label's position in the draft head (0 where absent)
    label_logp: torch.Tensor  # [B, T, K] the target's log-probabilities there (-inf where absent)
    weight: torch.Tensor  # [B, T] 1 on labelled (answer) positions


def _tensors(d: TeacherData, ids: list[int], head_pos: torch.Tensor, dev: torch.device) -> _Batch:
    """``head_pos``: ``[V]`` each token id's row in the draft head, -1 if it has none."""
    T = max(len(d.seqs[i]) for i in ids)
    K = d.top_ids[ids[0]].shape[1]
    tokens = torch.zeros((len(ids), T), dtype=torch.int64)
    pos = torch.full((len(ids), T, K), -1, dtype=torch.int64)
    logits = torch.zeros((len(ids), T, K))
    for b, i in enumerate(ids):
        n, p = len(d.seqs[i]), d.prompt_lens[i]
        tokens[b, :n] = torch.tensor(d.seqs[i])
        a = n - p  # answer tokens; position p - 1 + t predicts answer token t
        pos[b, p - 1:p - 1 + a] = head_pos[d.top_ids[i].long()]
        logits[b, p - 1:p - 1 + a] = d.top_logits[i].float()
    present = pos >= 0
    logp = F.log_softmax(logits.masked_fill(~present, float("-inf")), -1).nan_to_num(nan=float("-inf"))
    weight = present.any(-1).float()
    return _Batch(tokens.to(dev), pos.clamp_min(0).to(dev), logp.to(dev), weight.to(dev))


def loss_fn(draft: Transformer, batch: _Batch) -> tuple[torch.Tensor, float]:
    """Weighted mean of KL(p_target || p_draft) (target: its top-K over the head's ids,
    renormalized; draft: softmax over all the head's ids); and the share of labelled
    positions where the draft's top choice is the target's."""
    head = draft.head_weight() if draft.head_ids is None else draft.head_rows()  # [S, dim]
    with torch.autocast(batch.tokens.device.type, dtype=torch.bfloat16, enabled=batch.tokens.device.type == "cuda"):
        h = draft.forward_dense(batch.tokens)  # [B, T, dim]
        logp_d = F.log_softmax(F.linear(h, head).float(), -1)  # [B, T, S]
    picked = logp_d.gather(-1, batch.label_pos)  # [B, T, K]
    p_t = batch.label_logp.exp()
    kl = (p_t * (batch.label_logp.clamp_min(-1e4) - picked)).sum(-1)  # [B, T]
    agree = (logp_d.argmax(-1) == batch.label_pos[..., 0]).float() * (batch.label_logp[..., 0] > -1e30)
    w = batch.weight
    return (kl * w).sum() / w.sum().clamp_min(1.0), float((agree * w).sum() / w.sum().clamp_min(1.0))


def _head_pos(vocab: int, head_ids: torch.Tensor | None) -> torch.Tensor:
    if head_ids is None:
        return torch.arange(vocab)
    pos = torch.full((vocab,), -1, dtype=torch.int64)
    pos[head_ids.cpu()] = torch.arange(len(head_ids))
    return pos


def _heldout_agreement(draft: Transformer, d: TeacherData, ids: list[int], head_pos: torch.Tensor, dev: torch.device,
                       batch_tokens: int) -> float:
    """Teacher-forced top-1 agreement with the target on held-out answer positions."""
    num = den = 0.0
    with torch.no_grad():
        for chunk in _batches([len(s) for s in d.seqs], ids, batch_tokens, random.Random(0)):
            batch = _tensors(d, chunk, head_pos, dev)
            _, agree = loss_fn(draft, batch)
            num += agree * float(batch.weight.sum())
            den += float(batch.weight.sum())
    return num / den if den else 0.0


def distill(target_spec: str | LoadedModel, out: Path, cfg: DistillConfig, device: str = "cpu") -> dict[str, Any]:
    t0 = time.monotonic()
    deadline = t0 + cfg.minutes * 60
    dev = torch.device(device)
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(cfg.seed)
    target = loader.load(target_spec) if isinstance(target_spec, str) else target_spec
    target_name = target_spec if isinstance(target_spec, str) else target.source
    target.model.to(dev)
    # Half the budget at most goes to making data; a rerun continues where it stopped.
    d = teacher_data(target, cfg, out / "data.pt", t0 + cfg.minutes * 30)
    for extra in cfg.extra_data:
        d.merge(TeacherData(Path(extra)))
    if not d.seqs:
        raise RuntimeError("no teacher data yet: give the run more --minutes")
    head_ids = (choose_head_ids(d.seqs, d.prompt_lens, cfg.head_vocab, target.config.eos_token_ids,
                                target.config.vocab_size)
                if cfg.head_vocab and cfg.head_vocab < target.config.vocab_size else None)
    head_pos = _head_pos(target.config.vocab_size, head_ids)
    drafts = {n: init_draft(target.model, n, head_ids).to(dev) for n in cfg.layers}
    params = {n: [p for p in dr.parameters() if p.requires_grad] for n, dr in drafts.items()}
    opts = {n: torch.optim.AdamW(params[n], lr=cfg.lr, weight_decay=cfg.weight_decay) for n in drafts}
    ckpt = out / "checkpoint.pt"
    step = 0
    if ckpt.is_file():
        state = torch.load(ckpt, weights_only=True, map_location=dev)
        for n, dr in drafts.items():
            dr.load_state_dict(state["drafts"][str(n)], strict=False)
            opts[n].load_state_dict(state["opts"][str(n)])
        step = state["step"]
    split = random.Random(cfg.seed)
    ids = list(range(len(d.seqs)))
    split.shuffle(ids)
    n_hold = int(len(ids) * cfg.holdout)
    held, train = ids[:n_hold], ids[n_hold:]
    lens = [len(s) for s in d.seqs]
    rng = random.Random(cfg.seed + step)
    epoch: list[list[int]] = []
    bar = tqdm(total=cfg.steps, initial=step, desc="distill", unit="step")
    ema: dict[int, tuple[float, float]] = {}
    t_train = time.monotonic()

    def save() -> None:
        trainable = {str(n): {k: v for k, v in dr.state_dict().items() if not k.startswith(("embed.", "lm_head."))}
                     for n, dr in drafts.items()}
        torch.save({"drafts": trainable, "opts": {str(n): o.state_dict() for n, o in opts.items()}, "step": step},
                   ckpt)

    while step < cfg.steps and time.monotonic() < deadline:
        done = max(step / cfg.steps, (time.monotonic() - t_train) / max(deadline - t_train, 1e-9))
        lr = cfg.lr * min(1.0, (step + 1) / cfg.warmup) * 0.5 * (1 + math.cos(math.pi * min(done, 1.0)))
        if not epoch:
            epoch = _batches(lens, train, cfg.batch_tokens, rng)
        batch = _tensors(d, epoch.pop(), head_pos, dev)
        for n, dr in drafts.items():
            for g in opts[n].param_groups:
                g["lr"] = lr
            loss, top1 = loss_fn(dr, batch)
            opts[n].zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params[n], 1.0)
            opts[n].step()
            lo = float(loss.detach())
            prev = ema.get(n, (lo, top1))
            ema[n] = (0.95 * prev[0] + 0.05 * lo, 0.95 * prev[1] + 0.05 * top1)
        step += 1
        bar.update(1)
        bar.set_postfix_str(" ".join(f"L{n}: loss {lo:.3f} top1 {t1:.3f}" for n, (lo, t1) in ema.items())
                            + f" lr {lr:.1e}")
        if step % 25 == 0:
            save()
    bar.close()
    save()
    answer_tokens = sum(len(s) - p for s, p in zip(d.seqs, d.prompt_lens, strict=True))
    covered = answer_tokens
    if head_ids is not None:
        keep = set(head_ids.tolist())
        covered = sum(t in keep for s, p in zip(d.seqs, d.prompt_lens, strict=True) for t in s[p:])
    metrics: dict[str, Any] = {
        "steps": step, "sequences": len(d.seqs), "answer_tokens": answer_tokens,
        "self_prompts": len(d.self_prompts or []), "head_coverage": covered / answer_tokens if answer_tokens else 0.0,
        "minutes": (time.monotonic() - t0) / 60, "drafts": {},
    }
    for n, dr in drafts.items():
        dr.eval().requires_grad_(False)
        metrics["drafts"][f"L{n}"] = {"loss": ema.get(n, (0.0, 0.0))[0], "train_top1": ema.get(n, (0.0, 0.0))[1],
                                      "heldout_top1": _heldout_agreement(dr, d, held, head_pos, dev,
                                                                         cfg.batch_tokens)}
    for n, dr in drafts.items():
        dr.cpu()
        loader.save_hf_dir(dr, out / f"draft-L{n}", dtype=torch.bfloat16, borrow_embedding=True,
                           extra={"target": target_name, "distill": asdict(cfg), "metrics": metrics})
    (out / "metrics.json").write_text(json.dumps(metrics, indent=1) + "\n")
    return metrics
