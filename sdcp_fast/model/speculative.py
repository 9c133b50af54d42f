"""In-process speculative decoding: drafter -> one batched target pass -> rule 1 or 2.

A plain loop for ``sdcp-fast generate`` and the benchmark; the SDCP engine drives sessions
through the protocol core instead. Acceptance uses ``sdcp_fast.kernels``' verifiers.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from sdcp_fast.model.interfaces import Drafter, ScoreRequest
from sdcp_fast.kernels import apply_sampling_profile, sample_from_probs, verify_greedy, verify_speculative

from .runner import ModelRunner, greedy_token


@dataclass(frozen=True)
class Sampling:
    rule: int = 1
    temperature_milli: int | None = None
    top_k: int | None = None
    top_p_milli: int | None = None
    seed: int | None = None


@dataclass
class Result:
    tokens: list[int] = field(default_factory=list)  # generated ids (prompt excluded)
    accepted: int = 0  # proposed tokens accepted
    proposed: int = 0
    rounds: int = 0
    target_passes: int = 0  # batched passes this session took part in
    seconds: float = 0.0

    @property
    def acceptance(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0

    @property
    def tokens_per_pass(self) -> float:
        return len(self.tokens) / self.target_passes if self.target_passes else 0.0


def _seeded(seed: int | None, salt: int) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed((seed if seed is not None else int(time.time_ns())) * 2 + salt)
    return g


def generate(target: ModelRunner, drafter: Drafter | None, prompts: Sequence[Sequence[int]], max_new: int, *,
             m: int = 4, sampling: Sampling | None = None, stop: Sequence[int] = ()) -> list[Result]:
    """Decode every prompt to ``max_new`` tokens or a stop token; all sessions share each
    target pass. ``drafter=None`` is plain target decoding (one token per pass)."""
    sp = sampling or Sampling()
    # The verifier's randoms and the drafter's come from independent streams (§6.4).
    g_verify, g_draft = _seeded(sp.seed, 0), _seeded(sp.seed, 1)
    sessions = [f"gen-{i}".encode() for i in range(len(prompts))]
    ctx = [list(p) for p in prompts]
    results = [Result() for _ in prompts]
    live = [i for i, p in enumerate(prompts) if max_new > 0]
    stops = set(stop)
    t0 = time.perf_counter()
    while live:
        drafts: dict[int, list[int]] = {}
        q_rows: dict[int, torch.Tensor | None] = {}
        if drafter is not None:
            for i in live:
                mi = max(1, min(m, max_new - len(results[i].tokens) - 1)) if max_new - len(results[i].tokens) > 1 \
                    else 0
                if mi == 0:
                    drafts[i], q_rows[i] = [], None
                    continue
                d = drafter.propose(sessions[i], ctx[i], mi, rule=sp.rule, temperature_milli=sp.temperature_milli,
                                    top_k=sp.top_k, top_p_milli=sp.top_p_milli, generator=g_draft)
                drafts[i], q_rows[i] = d.tokens, d.q_rows
        else:
            drafts = {i: [] for i in live}
        logits = target.score([ScoreRequest(sessions[i], ctx[i], drafts[i]) for i in live])
        for i, lg in zip(live, logits, strict=True):
            emitted = _accept(lg, drafts[i], q_rows.get(i), sp, g_verify)
            r = results[i]
            r.rounds += 1
            r.target_passes += 1
            r.proposed += len(drafts[i])
            r.accepted += len(emitted) - 1
            for tok in emitted:
                if len(r.tokens) >= max_new:
                    break
                r.tokens.append(tok)
                ctx[i].append(tok)
                if tok in stops:
                    break
        live = [i for i in live if len(results[i].tokens) < max_new and not (results[i].tokens and
                                                                              results[i].tokens[-1] in stops)]
    for s in sessions:
        target.release(s)
        if drafter is not None:
            drafter.release(s)
    elapsed = time.perf_counter() - t0
    for r in results:
        r.seconds = elapsed
    return results


def _accept(logits: torch.Tensor, draft: list[int], q: torch.Tensor | None, sp: Sampling,
            g: torch.Generator) -> list[int]:
    """The tokens one round commits: accepted draft tokens plus one from the target."""
    if not draft:
        if sp.rule == 1:
            return [greedy_token(logits[0])]
        probs = apply_sampling_profile(logits[:1], sp.temperature_milli, sp.top_k, sp.top_p_milli)
        return [int(sample_from_probs(probs, torch.rand(1, generator=g, dtype=torch.float64))[0])]
    tokens = torch.tensor(draft, dtype=torch.int64)
    cu = torch.tensor([0, len(draft)], dtype=torch.int64)
    if sp.rule == 1:
        _, emitted = verify_greedy(logits, tokens, cu)
    else:
        if q is None:
            raise ValueError("rule 2 needs the drafter's q rows")
        u = torch.rand((1, len(draft) + 1, 2), generator=g, dtype=torch.float64)
        _, emitted, bad = verify_speculative(logits, sp.temperature_milli, sp.top_k, sp.top_p_milli, q, tokens,
                                             cu, u)
        if bool(bad[0]):
            raise ValueError("drafter proposed a token its own row gives probability 0")
    return [int(t) for t in emitted[0].tolist() if t >= 0]
