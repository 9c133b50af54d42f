"""Train the tiny target/draft pair for fast tests from scratch, on plain English text.

Text: the GNU Collaborative International Dictionary of English from Debian's ``dict-gcide``
package (definitions and quotations, markup stripped; ~20 MB of plain sentences). Then:

1. a 4096-token byte-level BPE (``tokenizers``; ``<|endoftext|>`` is token 0 and the eos),
2. ``CONFIGS["tiny-target"]`` (4 layers, d=256) trained with next-token cross-entropy and, on
   the same batches, ``CONFIGS["tiny-draft"]`` (1 layer, d=128) with 0.2 x cross-entropy +
   0.8 x KL(target || draft) on the target's logits of that step (no extra target pass),
3. a few draft-only steps against the final target (AdamW everywhere, cosine schedules),
4. both saved as bf16 HF directories in ``sdcp_fast/data/models/tiny-{target,draft}``,
5. the draft's acceptance (rule 1, M = 4) on held-out paragraphs, through the engine path
   (``load_drafter("model:...")`` + ``deploy.local.generate``), checked equal to greedy.

No network: get the package first (``apt-get download dict-gcide``) and pass the .deb::

    python scripts/make_tiny_pair.py --deb /tmp/dict-gcide_0.48.5+nmu2_all.deb

Seeded. ``--minutes`` (default 15) bounds the training: each phase's schedule runs on the
larger of its step and its time fraction, so a busy machine gets fewer steps (and a result
that depends on the load) while a quiet one runs exactly the given steps (same seed, same
threads: same result).
"""

from __future__ import annotations

import argparse
import gzip
import math
import random
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from tqdm import tqdm

from sdcp_fast.deploy.catalog import load_drafter, target_of
from sdcp_fast.deploy.local import generate
from sdcp_fast.model import loader
from sdcp_fast.model.config import CONFIGS
from sdcp_fast.model.llama import Transformer
from sdcp_fast.model.target_scorer import ModelRunner

EOS = "<|endoftext|>"
VOCAB = 4096
HEADWORD = re.compile(r"^[^\\]{1,80}\\[^\\]*\\,?")  # "Abuse \A*buse"\, n. [F. abus ..."


def read_gcide(deb: Path | None, dict_dz: Path | None) -> str:
    if dict_dz is None:
        if deb is None:
            sys.exit("pass --deb dict-gcide_*.deb (apt-get download dict-gcide) or --dict gcide.dict.dz")
        tmp = Path(tempfile.mkdtemp(prefix="gcide-"))
        subprocess.run(["dpkg", "-x", str(deb), str(tmp)], check=True)
        dict_dz = tmp / "usr/share/dictd/gcide.dict.dz"
    return gzip.open(dict_dz).read().decode("utf-8", "replace")  # dictzip is gzip-compatible


def paragraphs(raw: str) -> list[str]:
    """Plain English sentences: entry headers, etymologies, source tags, attributions dropped."""
    out = []
    for para in re.split(r"\n\s*\n", raw):
        s = " ".join(line.strip() for line in para.split("\n"))
        s = HEADWORD.sub("", s)  # the entry's header, up to its pronunciation
        s = re.sub(r"\[[^\]]*\]", " ", s)  # [1913 Webster], [Obs.], etymologies
        s = re.sub(r"\([^)]*[\"`*][^)]*\),?", " ", s)  # pronunciations: (r *v rs")
        s = re.sub(r"^[\s,]*(?:(?:[a-z]{1,5}\.|&)\s*)+(?=[A-Z(0-9])", "", s)  # n., v. t., a. & n.
        s = re.sub(r"--\s?[A-Z][^.]{0,40}\.", " ", s)  # --Shak.
        s = re.sub(r"\([A-Z][a-z]+\.?\)", " ", s)  # (Law), (Bot.)
        s = s.replace("{", "").replace("}", "")
        s = re.sub(r"^\s*(\d+\.|\(\w\)|Syn:|Usage:|Note:|\s)+", "", s)
        s = re.sub(r"\s+", " ", s).strip()
        s = re.sub(r"\s+([,.;:])", r"\1", s)
        if len(s.split()) < 5 or sum(c.isalpha() for c in s) < 0.7 * len(s) or "\\" in s or s.startswith("00"):
            continue
        out.append(s)
    return out


def train_tokenizer(docs: list[str]) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=[EOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(docs, trainer)
    assert tok.token_to_id(EOS) == 0 and tok.get_vocab_size() == VOCAB
    return tok


def init_model(name: str, seed: int) -> Transformer:
    cfg = replace(CONFIGS[name], eos_token_ids=(0,))
    torch.manual_seed(seed)
    model = Transformer(cfg)
    for pname, p in model.named_parameters():
        if "norm" in pname:
            continue
        std = 0.02 / math.sqrt(2 * cfg.n_layers) if pname.endswith(("wo.weight", "w_down.weight")) else 0.02
        torch.nn.init.normal_(p, 0.0, std)
    return model


def batches(stream: torch.Tensor, batch: int, seq: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    while True:
        starts = torch.randint(0, len(stream) - seq - 1, (batch,), generator=g)
        yield torch.stack([stream[s:s + seq + 1] for s in starts.tolist()]).long()


def lr_at(step: int, progress: float, lr: float, warmup: int) -> float:
    """Linear warm-up, then cosine down to lr / 10 as ``progress`` goes from 0 to 1."""
    if step < warmup:
        return lr * (step + 1) / warmup
    return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


class Clock:
    """Progress of a phase: the larger of its step fraction and its time fraction, so that a
    busy machine still gets a full schedule within ``--minutes`` (fewer steps, same shape)."""

    def __init__(self, steps: int, seconds: float) -> None:
        self.steps, self.seconds, self.t0 = steps, seconds, time.monotonic()

    def progress(self, step: int) -> float:
        return max(step / self.steps, (time.monotonic() - self.t0) / self.seconds)


def optimizer(model: Transformer, args: argparse.Namespace) -> torch.optim.AdamW:
    model.train().requires_grad_(True)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    keep = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                              {"params": keep, "weight_decay": 0.0}], lr=args.lr, betas=(0.9, 0.95))


def step_(model: Transformer, opt: torch.optim.Optimizer, loss: torch.Tensor, lr: float) -> None:
    for group in opt.param_groups:
        group["lr"] = lr
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()


def draft_loss(logits: torch.Tensor, t_logits: torch.Tensor, y: torch.Tensor, kd: float) -> tuple[torch.Tensor, float]:
    """(1 - kd) * cross-entropy + kd * KL(target || draft); and the top-1 agreement with the target."""
    t_logp = F.log_softmax(t_logits.detach(), -1)
    logp = F.log_softmax(logits, -1)
    kl = F.kl_div(logp, t_logp, log_target=True, reduction="none").sum(-1).mean()
    ce = F.nll_loss(logp.reshape(-1, VOCAB), y.reshape(-1))
    agree = (logits.argmax(-1) == t_logp.argmax(-1)).float().mean().item()
    return (1 - kd) * ce + kd * kl, agree


def run_phase(desc: str, steps: int, seconds: float, data, one_step, names: tuple[str, ...]) -> int:
    """Call ``one_step(x, y, step, progress) -> metrics`` on batches of ``data`` until ``steps``
    or ``seconds`` run out (see ``Clock``), with a tqdm bar of the metrics' moving averages.
    Returns the steps done."""
    clock = Clock(steps, seconds)
    bar = tqdm(range(steps), desc=desc, unit="step", dynamic_ncols=True)
    ema: list[float] = []
    done = 0
    for step in bar:
        progress = clock.progress(step)
        if progress >= 1:
            bar.write(f"--minutes reached at {desc} step {step}/{steps}")
            break
        xy = next(data)
        now = one_step(xy[:, :-1], xy[:, 1:], step, progress)
        ema = now if not ema else [0.98 * e + 0.02 * v for e, v in zip(ema, now, strict=True)]
        bar.set_postfix({n: f"{v:.3f}" for n, v in zip(names, ema, strict=True)}, refresh=False)
        done = step + 1
    bar.close()
    return done


def train_pair(target: Transformer, draft: Transformer, stream: torch.Tensor, args: argparse.Namespace,
               seconds: float) -> int:
    """Both models on the same batches: the target on the text, the draft on the text and on the
    target's current logits (already computed for the target's own loss: no extra pass)."""
    opts = optimizer(target, args), optimizer(draft, args)

    def one_step(x: torch.Tensor, y: torch.Tensor, step: int, progress: float) -> list[float]:
        t_logits = target.logits(target.forward_dense(x))  # [B, T, V] float32
        t_loss = F.cross_entropy(t_logits.reshape(-1, VOCAB), y.reshape(-1))
        d_loss, agree = draft_loss(draft.logits(draft.forward_dense(x)), t_logits, y, args.kd)
        lr = lr_at(step, progress, args.lr, args.warmup)
        step_(target, opts[0], t_loss, lr)
        step_(draft, opts[1], d_loss, lr)
        return [t_loss.item(), d_loss.item(), agree]

    done = run_phase("target+draft", args.target_steps, seconds, batches(stream, args.batch, args.seq, args.seed + 1),
                     one_step, ("ce", "draft", "top1"))
    target.eval().requires_grad_(False)
    return done


def polish_draft(target: Transformer, draft: Transformer, stream: torch.Tensor, args: argparse.Namespace,
                 seconds: float) -> int:
    """A few more draft steps against the final target (one no-grad target pass each)."""
    opt = optimizer(draft, args)

    def one_step(x: torch.Tensor, y: torch.Tensor, step: int, progress: float) -> list[float]:
        with torch.no_grad():
            t_logits = target.logits(target.forward_dense(x))
        loss, agree = draft_loss(draft.logits(draft.forward_dense(x)), t_logits, y, args.kd)
        step_(draft, opt, loss, lr_at(step, progress, args.lr * args.draft_lr_scale, 0))
        return [loss.item(), agree]

    done = run_phase("draft", args.draft_steps, seconds, batches(stream, args.batch, args.seq, args.seed + 2),
                     one_step, ("loss", "top1"))
    draft.eval().requires_grad_(False)
    return done


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--deb", type=Path, help="dict-gcide_*.deb (apt-get download dict-gcide)")
    p.add_argument("--dict", type=Path, help="an extracted gcide.dict.dz instead of the .deb")
    p.add_argument("--out", type=Path, default=loader.shipped_path("tiny-target").parent)
    p.add_argument("--target-steps", type=int, default=1000, help="steps of the target (and the draft with it)")
    p.add_argument("--draft-steps", type=int, default=300, help="then draft-only steps against the final target")
    p.add_argument("--draft-lr-scale", type=float, default=0.3, help="their peak lr, relative to --lr")
    p.add_argument("--minutes", type=float, default=15.0,
                   help="cap on training time: --target-share of it for the pair, the rest for the draft alone")
    p.add_argument("--target-share", type=float, default=0.8)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--kd", type=float, default=0.8, help="weight of KL(target || draft) in the draft's loss")
    p.add_argument("--heldout", type=int, default=2000, help="paragraphs kept out of training")
    p.add_argument("--eval-prompts", type=int, default=12)
    p.add_argument("--max-new", type=int, default=32)
    p.add_argument("--threads", type=int, default=2,
                   help="torch threads; 1 is several times faster when another job keeps the cores busy")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    t_start = time.monotonic()

    docs = paragraphs(read_gcide(args.deb, args.dict))
    random.Random(args.seed).shuffle(docs)
    held, docs = docs[: args.heldout], docs[args.heldout:]
    print(f"text: {len(docs)} training paragraphs ({sum(map(len, docs)) / 1e6:.1f} MB), {len(held)} held out")
    tok = train_tokenizer(docs)
    ids: list[int] = []
    for enc in tok.encode_batch(docs, add_special_tokens=False):
        ids.extend(enc.ids)
        ids.append(0)
    stream = torch.tensor(ids, dtype=torch.int16)
    print(f"tokenizer: {VOCAB} tokens, {len(stream) / 1e6:.2f} M training tokens "
          f"({time.monotonic() - t_start:.0f} s)")

    t_train = time.monotonic()
    target, draft = init_model("tiny-target", args.seed), init_model("tiny-draft", args.seed + 1)
    n_pair = train_pair(target, draft, stream, args, args.minutes * 60 * args.target_share)
    t_mid = time.monotonic()
    n_draft = polish_draft(target, draft, stream, args, args.minutes * 60 * (1 - args.target_share))
    t_end = time.monotonic()
    print(f"training: {n_pair} pair steps in {(t_mid - t_train) / 60:.1f} min, {n_draft} draft steps in "
          f"{(t_end - t_mid) / 60:.1f} min ({args.batch} x {args.seq} tokens/step)")

    tdir, ddir = args.out / "tiny-target", args.out / "tiny-draft"
    loader.save_hf_dir(target, tdir, tokenizer=tok, dtype=torch.bfloat16)
    loader.save_hf_dir(draft, ddir, tokenizer=tok, dtype=torch.bfloat16)
    size = sum(f.stat().st_size for d in (tdir, ddir) for f in d.iterdir())
    print(f"saved {tdir} and {ddir}: {size / 1e6:.1f} MB")

    # Acceptance on held-out paragraphs, as the engine runs it (reloaded from the saved bf16 files).
    lm = loader.load(tdir)
    assert lm.tokenizer is not None
    prompts = [e.ids[:16] for e in lm.tokenizer.encode_batch(held, add_special_tokens=False) if len(e.ids) >= 32]
    prompts = prompts[: args.eval_prompts]
    runner = ModelRunner(lm.model)
    # No stop token: a paragraph's end is followed by another paragraph, so every prompt gets
    # max_new tokens (the tests measure the same way).
    greedy = generate(runner, None, prompts, args.max_new)
    target = target_of("tiny-target", lm)
    for m in (1, 4):
        res = generate(runner, load_drafter(f"model:{ddir}", target)[0], prompts, args.max_new, m=m)
        acc = sum(r.accepted for r in res) / max(1, sum(r.proposed for r in res))
        tpp = sum(len(r.tokens) for r in res) / max(1, sum(r.rounds for r in res))
        same = [r.tokens for r in res] == [r.tokens for r in greedy]
        print(f"draft acceptance (rule 1, M={m}, {len(prompts)} held-out prompts x {args.max_new} tokens): "
              f"{acc:.3f}, tokens/pass {tpp:.2f}, same-as-greedy {same}")
    for r, pr in list(zip(greedy, prompts, strict=True))[:3]:
        print(f"  {lm.tokenizer.decode(pr)!r} -> {lm.tokenizer.decode(r.tokens)!r}")
    print(f"total {(time.monotonic() - t_start) / 60:.1f} min")
    return 0


if __name__ == "__main__":
    sys.exit(main())
