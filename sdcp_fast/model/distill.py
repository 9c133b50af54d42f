"""Distil a small draft from its target: the target's own greedy generations on a prompt
set are the data, the target's next-token distributions the labels.

The draft starts as the target's first ``n_layers`` layers and final norm, shares the
target's embedding and tied head (frozen, not shipped), and learns to make its last hidden
state predict what the target's final one does. Loss per position: KL(p_target || p_draft)
over the target's top-K tokens (both renormalized there; the head is only applied to those
K rows, so the 49152-wide output layer costs almost nothing) plus the mean squared error
between the draft's and the target's final normalized hidden states, which keeps the rest
of the vocabulary in line. Resumable: teacher data and checkpoints live in the output
directory.
"""

from __future__ import annotations

import copy
import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from sdcp_fast import data

from . import loader
from .config import ModelConfig
from .llama import Transformer, rope_inv_freq
from .loader import LoadedModel
from .runner import ModelRunner
from .speculative import Sampling, generate
from .tokenizer import chat_prompt, encode


@dataclass
class DistillConfig:
    n_layers: int = 2
    gen_tokens: int = 64  # target tokens generated per training prompt
    prompts: int = 192  # training prompts used (of the built-in set)
    gen_batch: int = 32  # sessions per batched target pass while generating
    samples: int = 0  # sampled (temperature 0.8) continuations per prompt, besides the greedy one
    prompt_weight: float = 0.1  # loss weight of prompt positions (drafting happens after them)
    top_k: int = 64
    hidden_weight: float = 1.0
    steps: int = 600
    batch: int = 8
    lr: float = 5e-4
    weight_decay: float = 0.0
    warmup: int = 20
    minutes: float = 60.0  # stop (and save) when the budget is spent; rerun to continue
    seed: int = 0


def teacher_data(target: LoadedModel, cfg: DistillConfig, path: Path, device: torch.device) -> dict[str, object]:
    """Token sequences, the target's final hidden states and its top-K logits at every position."""
    if path.is_file():
        return torch.load(path, weights_only=True)  # type: ignore[no-any-return]
    assert target.tokenizer is not None
    prompts = [encode(target.tokenizer, chat_prompt(p["text"])) for p in data.prompts("train")][: cfg.prompts]
    runner = ModelRunner(target.model)
    partial = path.with_suffix(".gen.json")  # generations so far, so a restart resumes here
    seqs: list[list[int]] = json.loads(partial.read_text()) if partial.is_file() else []
    stop = list(target.config.eos_token_ids)
    jobs = [(p, k) for k in range(1 + cfg.samples) for p in prompts]  # k = 0: greedy
    bar = tqdm(total=len(jobs), initial=len(seqs), desc="teacher generations", unit="seq")
    for i in range(len(seqs), len(jobs), cfg.gen_batch):
        chunk = [p for p, _ in jobs[i:i + cfg.gen_batch]]
        k = jobs[i][1]
        sp = Sampling() if k == 0 else Sampling(rule=2, temperature_milli=800, seed=cfg.seed * 1000 + i)
        for p, r in zip(chunk, generate(runner, None, chunk, cfg.gen_tokens, sampling=sp, stop=stop), strict=True):
            seqs.append(p + r.tokens)
        partial.write_text(json.dumps(seqs))
        bar.update(len(chunk))
    bar.close()
    hid, idx, val = [], [], []
    model = target.model
    with torch.inference_mode():
        for i in tqdm(range(0, len(seqs), 8), desc="teacher labels", unit="batch"):
            group = seqs[i:i + 8]
            padded = torch.zeros((len(group), max(map(len, group))), dtype=torch.int64)
            for b, s in enumerate(group):  # right padding: causal attention never looks at it
                padded[b, : len(s)] = torch.tensor(s)
            hs = model.forward_dense(padded.to(device))  # [B, T, dim]
            for b, s in enumerate(group):
                h = hs[b, : len(s)]
                top = model.logits(h).topk(cfg.top_k, dim=-1)  # [T, K]
                hid.append(h.half().cpu())
                idx.append(top.indices.int().cpu())
                val.append(top.values.half().cpu())
    out = {"seqs": seqs, "hidden": hid, "top_idx": idx, "top_val": val,
           "prompt_lens": [len(p) for p, _ in jobs]}
    torch.save(out, path)
    return out


def init_draft(target: Transformer, n_layers: int) -> Transformer:
    cfg: ModelConfig = target.cfg.with_layers(n_layers)
    draft = Transformer.__new__(Transformer)
    torch.nn.Module.__init__(draft)
    draft.cfg = cfg
    draft.embed = target.embed  # shared and frozen
    draft.layers = torch.nn.ModuleList(copy.deepcopy(target.layers[i]) for i in range(n_layers))
    draft.norm = copy.deepcopy(target.norm)
    draft.lm_head = target.lm_head  # shared and frozen too (None when tied)
    draft.register_buffer("inv_freq", rope_inv_freq(cfg), persistent=False)
    for p in [*draft.layers.parameters(), *draft.norm.parameters()]:
        p.requires_grad_(True)
    return draft


def _batch(teacher: dict[str, list], ids: list[int], device: torch.device,
           prompt_weight: float = 1.0) -> tuple[torch.Tensor, ...]:
    seqs = [teacher["seqs"][i] for i in ids]
    T = max(len(s) for s in seqs)
    B = len(ids)
    K = teacher["top_idx"][0].shape[1]
    dim = teacher["hidden"][0].shape[1]
    tokens = torch.zeros((B, T), dtype=torch.int64)
    mask = torch.zeros((B, T))  # loss weight per position, 0 on padding
    hid = torch.zeros((B, T, dim))
    tidx = torch.zeros((B, T, K), dtype=torch.int64)
    tval = torch.zeros((B, T, K))
    for b, i in enumerate(ids):
        n = len(teacher["seqs"][i])
        tokens[b, :n] = torch.tensor(teacher["seqs"][i])
        mask[b, :n] = 1.0
        if "prompt_lens" in teacher:  # positions before the last prompt token predict prompt text
            mask[b, : teacher["prompt_lens"][i] - 1] = prompt_weight
        hid[b, :n] = teacher["hidden"][i].float()
        tidx[b, :n] = teacher["top_idx"][i].long()
        tval[b, :n] = teacher["top_val"][i].float()
    return tuple(t.to(device) for t in (tokens, mask, hid, tidx, tval))


def loss_fn(draft: Transformer, batch: tuple[torch.Tensor, ...], hidden_weight: float) -> tuple[torch.Tensor, float]:
    tokens, mask, hid_t, tidx, tval = batch
    h = draft.forward_dense(tokens)  # [B, T, dim]
    w = draft.head_weight()[tidx]  # [B, T, K, dim] head rows of the target's top-K tokens
    logits_d = torch.einsum("btd,btkd->btk", h, w)  # [B, T, K]
    logp_t = F.log_softmax(tval, -1)
    kl = (logp_t.exp() * (logp_t - F.log_softmax(logits_d, -1))).sum(-1)  # [B, T]
    mse = (h - hid_t).pow(2).mean(-1) / hid_t.pow(2).mean(-1).clamp_min(1e-6)
    per_tok = kl + hidden_weight * mse
    top1 = (logits_d.argmax(-1) == 0).float()  # topk is sorted: index 0 is the target's argmax
    m = mask
    return (per_tok * m).sum() / m.sum(), float((top1 * m).sum() / m.sum())


def distill(target_spec: str, out: Path, cfg: DistillConfig, device: str = "cpu") -> dict[str, float]:
    dev = torch.device(device)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(cfg.seed)
    target = loader.load(target_spec)
    target.model.to(dev)
    teacher = teacher_data(target, cfg, out / "teacher.pt", dev)
    draft = init_draft(target.model, cfg.n_layers).to(dev)
    draft.embed.requires_grad_(False)
    params = [p for p in draft.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    ckpt = out / "checkpoint.pt"
    step = 0
    if ckpt.is_file():
        state = torch.load(ckpt, weights_only=True)
        draft.load_state_dict(state["draft"], strict=False)
        opt.load_state_dict(state["opt"])
        step = state["step"]
    n = len(teacher["seqs"])
    gen = torch.Generator().manual_seed(cfg.seed + step)
    deadline = time.monotonic() + cfg.minutes * 60
    bar = tqdm(total=cfg.steps, initial=step, desc="distill", unit="step")
    loss_ema = top1_ema = None

    def save() -> None:
        trainable = {k: v for k, v in draft.state_dict().items() if not k.startswith(("embed.", "lm_head."))}
        torch.save({"draft": trainable, "opt": opt.state_dict(), "step": step}, ckpt)

    while step < cfg.steps and time.monotonic() < deadline:
        lr = cfg.lr * min(1.0, (step + 1) / cfg.warmup) * 0.5 * (1 + math.cos(math.pi * step / cfg.steps))
        for g in opt.param_groups:
            g["lr"] = lr
        ids = torch.randint(0, n, (cfg.batch,), generator=gen).tolist()
        loss, top1 = loss_fn(draft, _batch(teacher, ids, dev, cfg.prompt_weight), cfg.hidden_weight)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        step += 1
        loss_ema = float(loss) if loss_ema is None else 0.95 * loss_ema + 0.05 * float(loss)
        top1_ema = top1 if top1_ema is None else 0.95 * top1_ema + 0.05 * top1
        bar.update(1)
        bar.set_postfix(loss=f"{loss_ema:.3f}", top1=f"{top1_ema:.3f}", lr=f"{lr:.1e}")
        if step % 25 == 0:
            save()
    bar.close()
    save()
    draft.eval().requires_grad_(False)
    draft.cpu()
    loader.save_hf_dir(draft, out / "draft", dtype=torch.bfloat16, borrow_embedding=True,
                       extra={"target": target_spec, "distill": asdict(cfg), "steps_done": step})
    metrics = {"steps": step, "loss": loss_ema or 0.0, "train_top1": top1_ema or 0.0}
    (out / "metrics.json").write_text(json.dumps(metrics, indent=1) + "\n")
    return metrics
