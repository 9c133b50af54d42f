"""Sampling profiles (§4.1) and inverse-CDF sampling."""

from __future__ import annotations

import torch

from . import backends, params

IntParam = int | torch.Tensor | None


def apply_sampling_profile(logits: torch.Tensor, temperature_milli: IntParam = None, top_k: IntParam = None,
                           top_p_milli: IntParam = None, backend: str = "auto") -> torch.Tensor:
    """The §4.1 target distribution of each row: temperature, then top-k, then top-p.

    Tokens are ranked by (logit descending, token id ascending), which is the order of
    probability descending with ties to the smallest id, exact in every precision. Top-k
    keeps the first k of that order; top-p then keeps token j iff the probability mass of
    the kept tokens ranked before j is < top_p times the mass kept by top-k (so at least
    one token is kept); the kept tokens are renormalized. Temperature 0 gives the one-hot
    argmax (ties to the smallest id).

    Parameters
    ----------
    logits : torch.Tensor
        Shape: ``[N, V]``; dtype float32 or bfloat16.
    temperature_milli : int or torch.Tensor, optional
        Scalar or shape ``[N]`` integer; temperature x 1000. Absent means 1000; 0 means argmax.
    top_k : int or torch.Tensor, optional
        Scalar or shape ``[N]`` integer. Absent, 0 or >= V disables it.
    top_p_milli : int or torch.Tensor, optional
        Scalar or shape ``[N]`` integer; top-p x 1000. Absent, 0 or >= 1000 disables it.
    backend : str
        ``"auto"``, ``"reference"``, ``"cpu"`` or ``"triton"``.

    Returns
    -------
    torch.Tensor
        Shape: ``[N, V]``; dtype float32. Rows sum to 1; filtered tokens are exactly 0. On the
        triton backend, profile members given as device tensors are checked by the kernel
        (no host sync): a row with a negative entry comes back as NaN.
    """
    logits = params.logits_2d(logits, "logits")
    name = backends.resolve(backend, logits.device)
    rows, vocab = logits.shape
    prof = (params.device_profile(rows, temperature_milli, top_k, top_p_milli, vocab, logits.device)
            if name == "triton" else params.profile(rows, temperature_milli, top_k, top_p_milli, vocab))
    return backends.load(name).apply_sampling_profile(logits, prof)


def sample_from_probs(probs: torch.Tensor, uniforms: torch.Tensor, backend: str = "auto") -> torch.Tensor:
    """Draw one token per row by inverse CDF: the rule rule 2 of §6.4 uses for its draws.

    Token j is the smallest id whose cumulative weight, summed in ascending id order, exceeds
    ``r * total`` where total is the row's sum (rows need not be normalized). If rounding
    leaves no such id, the largest id with positive weight; -1 for a row with no positive weight.

    Parameters
    ----------
    probs : torch.Tensor
        Shape: ``[N, V]``; dtype float32; non-negative weights.
    uniforms : torch.Tensor
        Shape: ``[N]``; dtype float64; each in [0, 1).
    backend : str
        ``"auto"``, ``"reference"``, ``"cpu"`` or ``"triton"``.

    Returns
    -------
    torch.Tensor
        Shape: ``[N]``; dtype int32.
    """
    if probs.dim() != 2 or probs.dtype != torch.float32 or probs.shape[1] == 0:
        raise ValueError(f"probs must be float32 [N, V], got {probs.dtype} {tuple(probs.shape)}")
    if uniforms.shape != (probs.shape[0],) or uniforms.dtype != torch.float64:
        raise ValueError(f"uniforms must be float64 [{probs.shape[0]}], got {uniforms.dtype} "
                         f"{tuple(uniforms.shape)}")
    if uniforms.device != probs.device:
        raise ValueError("probs and uniforms must be on one device")
    name = backends.resolve(backend, probs.device)
    return backends.load(name).sample_from_probs(probs.contiguous(), uniforms.contiguous())
