"""Batched verification of speculative proposals: rules 1 and 2 of §6.4.

Ragged layout: session b has ``M_b = cu_draft[b+1] - cu_draft[b]`` draft tokens
``draft_tokens[cu_draft[b]:cu_draft[b+1]]`` and ``M_b + 1`` target rows starting at row
``cu_draft[b] + b`` (positions 1..M_b+1). ``M_max = max M_b``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from . import backends, params
from .sampling import IntParam


def verify_greedy(target_logits: torch.Tensor, draft_tokens: torch.Tensor, cu_draft: torch.Tensor,
                  backend: str = "auto", max_draft: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Rule 1: accept x[i] while it is the argmax of its target row (ties to the smallest id).

    Reads target rows 1..a+1 of each session (a = accepted), nothing after the first mismatch.
    The argmax of p under any profile is the argmax of the logits, so no profile is taken.

    Parameters
    ----------
    target_logits : torch.Tensor
        Shape: ``[D + B, V]``; dtype float32 or bfloat16.
    draft_tokens : torch.Tensor
        Shape: ``[D]``; integer token ids.
    cu_draft : torch.Tensor
        Shape: ``[B + 1]``; integer, ``cu_draft[0] = 0``, non-decreasing, ``cu_draft[B] = D``.
    backend : str
        ``"auto"``, ``"reference"``, ``"cpu"`` or ``"triton"``.
    max_draft : int, optional
        An upper bound on M_b; ``emitted`` then has ``max_draft + 1`` columns. With a device
        ``cu_draft`` and the triton backend it spares reading cu_draft on the host (no sync,
        CUDA-graph capturable); a session whose layout the kernel finds invalid (including
        M_b > max_draft) then gets accepted -1 and no emitted token.

    Returns
    -------
    accepted : torch.Tensor
        Shape: ``[B]``; int32; a_b in 0..M_b.
    emitted : torch.Tensor
        Shape: ``[B, M_max + 1]`` (or ``[B, max_draft + 1]``); int32; the a_b accepted tokens
        then the additional token, padded with -1 (exactly a_b + 1 entries are not -1).
    """
    target_logits = params.logits_2d(target_logits, "target_logits")
    dev = target_logits.device
    name = backends.resolve(backend, dev)
    width = None if max_draft is None else max_draft + 1
    lay = params.ragged(target_logits, draft_tokens, cu_draft, width, sync_free=name == "triton")
    if lay.checked and width is not None:
        if lay.m_max + 1 > width:
            raise ValueError(f"a session proposes {lay.m_max} tokens, more than max_draft = {max_draft}")
        if name == "triton":
            lay = params.Ragged(lay.cu_draft, width - 1)
    tokens = draft_tokens.to(dev, torch.int64, non_blocking=True).contiguous()
    accepted, emitted = backends.load(name).verify_greedy(target_logits, tokens, lay)
    if width is not None and emitted.shape[1] < width:
        emitted = torch.nn.functional.pad(emitted, (0, width - emitted.shape[1]), value=-1)
    return accepted, emitted


def verify_speculative(target_logits: torch.Tensor, temperature_milli: IntParam, top_k: IntParam,
                       top_p_milli: IntParam, q_probs: torch.Tensor | Sequence[torch.Tensor],
                       draft_tokens: torch.Tensor,
                       cu_draft: torch.Tensor, uniforms: torch.Tensor,
                       backend: str = "auto") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rule 2 (speculative sampling) for a batch of sessions.

    p[i] is the target row of position i under the session's profile (see
    :func:`apply_sampling_profile`). For i = 1..M_b in order: accept x[i] iff
    ``r < min(1, p[i](x[i]) / q[i](x[i]))`` with ``r = uniforms[b, i-1, 0]``. At the first
    rejected position the additional token is drawn from ``max(0, p[i] - q[i])`` (or p[i]
    if that is all zero through rounding) by inverse CDF (:func:`sample_from_probs`) with
    ``uniforms[b, i-1, 1]``; if all are accepted, from p[M_b+1] with ``uniforms[b, M_b, 1]``.
    A session with ``q[i](x[i]) <= 0`` (or NaN or inf) at any position is flagged ``bad`` before
    any uniform is used, and gets accepted 0 and no emitted token (answer ``sdcp-bad-proposal``).
    On the triton backend nothing is read on the host: with ``cu_draft``, the token ids and
    tensor profile members on the device (CUDA-graph capturable), the kernel checks what the
    host would have (layout, M_b + 1 <= the uniforms' width, token ids in range, profile
    entries >= 0) and flags a session that fails as ``bad`` instead of raising.

    What is read: q(x[i]) at every position; the target rows 1..a+1 (their max and
    normalizer, plus the kept set when top-k/top-p is on); the full q row and target row
    only at the first rejected position; the last target row only when all are accepted.
    (The triton backend takes the statistics of all M_b + 1 rows in one parallel pass
    instead of walking positions; docs/kernels.md says what each backend reads.)

    Parameters
    ----------
    target_logits : torch.Tensor
        Shape: ``[D + B, V]``; dtype float32 or bfloat16.
    temperature_milli, top_k, top_p_milli : int or torch.Tensor or None
        Scalar or shape ``[B]`` integer profile of each session (None: absent); see
        :func:`apply_sampling_profile`.
    q_probs : torch.Tensor or sequence of torch.Tensor
        Shape: ``[D, V]``, or one ``[M_b, V]`` per session; dtype float32; the draft
        distribution of each proposed position. Per session, the cpu backend reads each
        where it lies (e.g. mapped shared memory); the others take them gathered.
    draft_tokens : torch.Tensor
        Shape: ``[D]``; integer token ids.
    cu_draft : torch.Tensor
        Shape: ``[B + 1]``; integer, ``cu_draft[0] = 0``, non-decreasing, ``cu_draft[B] = D``.
    uniforms : torch.Tensor
        Shape: ``[B, M_max + 1, 2]``; dtype float64 in [0, 1): session, position i stored at
        i-1, purpose (0 acceptance test, 1 drawing the additional token). Unused entries are ignored.
    backend : str
        ``"auto"``, ``"reference"``, ``"cpu"`` or ``"triton"``.

    Returns
    -------
    accepted : torch.Tensor
        Shape: ``[B]``; int32.
    emitted : torch.Tensor
        Shape: ``[B, M_max + 1]``; int32; accepted tokens then the additional one, -1 padded.
    bad : torch.Tensor
        Shape: ``[B]``; bool; q(x[i]) was not positive at some position.
    """
    target_logits = params.logits_2d(target_logits, "target_logits")
    dev = target_logits.device
    name = backends.resolve(backend, dev)
    sync_free = name == "triton"
    width = uniforms.shape[1] if uniforms.dim() == 3 else None
    lay = params.ragged(target_logits, draft_tokens, cu_draft, width, sync_free)
    if isinstance(q_probs, torch.Tensor):
        q: torch.Tensor | list[torch.Tensor] = _gathered_q(q_probs, draft_tokens, target_logits)
    elif name == "cpu":  # each session's rows read where they lie; the binding checks each one
        q = [t.contiguous() for t in q_probs]
        if len(q) != lay.batch or any(t.device != dev for t in q):
            raise ValueError(f"q_probs must hold one tensor per session ({lay.batch}), on the logits' device")
    else:  # the other backends read one tensor
        q = _gathered_q(torch.cat(list(q_probs)), draft_tokens, target_logits)
    if uniforms.device != dev:
        raise ValueError("target_logits, q_probs and uniforms must be on one device")
    u = params.uniforms(uniforms, lay)
    rows, vocab = lay.batch, target_logits.shape[1]
    prof = (params.device_profile(rows, temperature_milli, top_k, top_p_milli, vocab, dev) if sync_free
            else params.profile(rows, temperature_milli, top_k, top_p_milli, vocab))
    tokens = draft_tokens.to(dev, torch.int64, non_blocking=True).contiguous()
    if isinstance(q, list):
        from . import cpu_backend  # the one backend that reads rows where they lie

        assert isinstance(prof, params.Profile)
        return cpu_backend.verify_speculative(target_logits, prof, q, tokens, lay, u)
    return backends.load(name).verify_speculative(target_logits, prof, q, tokens, lay, u)


def _gathered_q(q_probs: torch.Tensor, draft_tokens: torch.Tensor, target_logits: torch.Tensor) -> torch.Tensor:
    if q_probs.dtype != torch.float32 or q_probs.shape != (draft_tokens.numel(), target_logits.shape[1]):
        raise ValueError(f"q_probs must be float32 [D, V] = [{draft_tokens.numel()}, {target_logits.shape[1]}], "
                         f"got {q_probs.dtype} {tuple(q_probs.shape)}")
    if q_probs.device != target_logits.device:
        raise ValueError("target_logits, q_probs and uniforms must be on one device")
    return q_probs.contiguous()
